package store

import "strings"

// Enqueue's and EnqueueMany's inserts, in sql/producer.sql; relay.Enqueue and
// relay.EnqueueMany send them.

// tableSlot stands for the table in a statement rendered once for every
// table; the caller puts the table between its halves.
const tableSlot = "\x00table\x00"

// EnqueueSQL is Enqueue's insert without ([0]) and with ([1]) the wake-up,
// without ([.][0]) and with ([.][1]) headers, cut where the table goes:
// Enqueue names its table at each call.
var EnqueueSQL = [2][2][2]string{
	{cutAtTable("enqueue", Data{}), cutAtTable("enqueue", Data{Headers: true})},
	{cutAtTable("enqueue", Data{Wake: true}), cutAtTable("enqueue", Data{Wake: true, Headers: true})},
}

// EnqueueManySQL is EnqueueMany's insert, indexed and cut as EnqueueSQL.
var EnqueueManySQL = [2][2][2]string{
	{cutAtTable("enqueueMany", Data{}), cutAtTable("enqueueMany", Data{Headers: true})},
	{cutAtTable("enqueueMany", Data{Wake: true}), cutAtTable("enqueueMany", Data{Wake: true, Headers: true})},
}

// cutAtTable renders statement name for d, whose {{.Table}} appears once,
// and returns what comes before and after it.
func cutAtTable(name string, d Data) [2]string {
	d.Table = tableSlot
	before, after, ok := strings.Cut(Statements.Positional(name, d), tableSlot)
	if !ok || strings.Contains(after, tableSlot) {
		panic("relay: statement " + name + " must name its table once")
	}
	return [2]string{before, after}
}
