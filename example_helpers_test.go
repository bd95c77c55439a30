package relay_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// exampleSchema is where the examples' tables live, out of the tests' way.
const exampleSchema = "relay_examples"

// connect stands for the service's own pool in the examples: a pool on the
// test server (server().URL, started by TestMain) whose search_path is a fresh,
// empty schema, so each example starts as a new service would, with no outbox
// table, under the default table name.
func connect(ctx context.Context) *pgxpool.Pool {
	admin, err := pgx.Connect(ctx, server().URL)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	schema := pgx.Identifier{exampleSchema}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}

	pc, err := pgxpool.ParseConfig(server().URL)
	if err != nil {
		log.Fatal(err)
	}
	pc.MaxConns = 4
	pc.ConnConfig.RuntimeParams["search_path"] = exampleSchema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		log.Fatal(err)
	}
	return pool
}

// connectReplica stands for another replica's pool, on the same database and schema as connect's.
func connectReplica(ctx context.Context) *pgxpool.Pool {
	pc, err := pgxpool.ParseConfig(server().URL)
	if err != nil {
		log.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = exampleSchema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		log.Fatal(err)
	}
	return pool
}
