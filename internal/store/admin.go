package store

// Admin's statements, in sql/admin.sql; relay.Admin runs them.

// The statements of Admin that name no table.
var (
	PurgeCutoffSQL = Statements.Positional("purgeCutoff", Data{})
	ServerStateSQL = Statements.Positional("serverState", Data{})
	LockHoldersSQL = Statements.Positional("lockHolders", Data{})
	TableLocksSQL  = Statements.Positional("tableLocks", Data{})
)

// AdminSQL are the statements of relay.Admin for one table. A dead row is an
// outbound ERROR row whose attempts reached the ceiling (@ceiling everywhere).
type AdminSQL struct {
	Table          string // quoted
	CountSQL       string
	DeadPageSQL    string
	DeadTypeSQL    string
	DeadIDsSQL     string
	RequeueAllSQL  string
	RequeueTypeSQL string
	RequeueIDsSQL  string
	PurgeSQL       string

	LiveGroupsSQL   string
	SentByTypeSQL   string
	EstimateSentSQL string
	SampleSentSQL   string
	CountPurgeSQL   string
	SamplePurgeSQL  string

	HistorySQL string
}

// NewAdminSQL renders the statements of relay.Admin for table, with or
// without its optional requeued_at column.
func NewAdminSQL(table string, requeued bool) (*AdminSQL, error) {
	id, err := ParseTable(table)
	if err != nil {
		return nil, err
	}
	d := Data{Table: id.Sanitize(), Requeued: requeued}
	return &AdminSQL{
		Table:           d.Table,
		CountSQL:        Statements.Positional("countByStatus", d),
		DeadPageSQL:     Statements.Positional("deadPage", d),
		DeadTypeSQL:     Statements.Positional("deadPageOfType", d),
		DeadIDsSQL:      Statements.Positional("deadRows", d),
		RequeueAllSQL:   Statements.Positional("requeueAll", d),
		RequeueTypeSQL:  Statements.Positional("requeueType", d),
		RequeueIDsSQL:   Statements.Positional("requeueIDs", d),
		PurgeSQL:        Statements.Positional("purgeChunk", d),
		LiveGroupsSQL:   Statements.Positional("liveGroups", d),
		SentByTypeSQL:   Statements.Positional("sentByType", d),
		EstimateSentSQL: Statements.Positional("estimateSent", d),
		SampleSentSQL:   Statements.Positional("sampleSent", d),
		CountPurgeSQL:   Statements.Positional("countPurge", d),
		SamplePurgeSQL:  Statements.Positional("samplePurge", d),
		HistorySQL:      Statements.Positional("history", d),
	}, nil
}
