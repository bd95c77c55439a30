module github.com/xadm/relay/examples/console

go 1.25.0

require (
	github.com/jackc/pgx/v5 v5.12.0
	github.com/xadm/relay v0.1.0
	github.com/xadm/relay/console v0.1.0
)
