package store

import (
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"text/template"
)

// The SQL layer. Every statement the relay sends lives in sql/*.sql,
// embedded below, one file per concern, rendered by one Go file per concern
// of this package:
//
//	sql/schema.sql    the table's DDL            schema.go    (SchemaSQL, CreateTable)
//	sql/pass.sql      the pass's reads           pass.go      (the select, the idle poll, the probe)
//	sql/outcomes.sql  the fenced outcomes        outcomes.go
//	sql/admin.sql     Admin's statements         admin.go     (the relay's store_admin.go sends them)
//	sql/election.sql  guard, lease, partitions   election.go
//	sql/wake.sql      the wake-up on commit      wake.go      (WakeTriggerSQL, the listener)
//	sql/producer.sql  Enqueue's inserts          producer.go  (the relay's store_producer.go sends them)
//	sql/schedule.sql  the Scheduler's clock      schedule.go
//	sql/presence.sql  presence, table indexes    presence.go
//	sql/privileges.sql the relay's grants       privileges.go (the root's grants.go)
//	sql/registry.sql  which app delivers a type  registry.go
//
// A file holds statements, each under a marker line
//
//	-- name: stmtName @first @second
//
// whose optional list of parameters fixes their numbering ($1, $2 ...), for
// callers that pass their arguments in that order; parameters it does not
// list are numbered in order of first appearance (numbered). The comment
// lines right under the marker document the statement and are not sent; the
// rest, up to the next marker, is the statement, but for the comment and
// blank lines that end it (the next section's comment).
//
// A statement is a text/template run once when the statements are built,
// never per pass: per table and options when a Relay or an Admin is made, at
// package initialisation for those that name no table, once per won election
// for the heartbeat (its start) and per connection for the listener's
// LISTEN (its channel). Enqueue's and EnqueueMany's inserts are rendered once
// and cut where their per-call table goes. {{.Table}} is the quoted table;
// {{if .Backoff}}, {{if .Async}}, {{if .Partitioned}}, {{if .Wake}} the
// options (Data); {{template "name" .}} includes another statement of any
// file, a fragment.
// TestSQLFiles checks that every statement is used, lists only its own
// parameters, and is sent with exactly its arguments.

//go:embed sql/*.sql
var sqlFiles embed.FS

// sqlMarker is the line that starts a statement: its name, then its parameters.
var sqlMarker = regexp.MustCompile(`^-- name: ([A-Za-z][A-Za-z0-9]*)((?: @[a-z][a-z0-9_]*)*)\s*$`)

// sqlSet is every statement of sql/*.sql, parsed once; read-only afterwards.
type sqlSet struct {
	tmpl   *template.Template
	params map[string][]string // a statement's listed parameters, in their order
	files  map[string]string   // a statement's file
}

var Statements = mustParseSQL(sqlFiles)

func mustParseSQL(fsys fs.FS) *sqlSet {
	s, err := parseSQL(fsys)
	if err != nil {
		panic("relay: " + err.Error())
	}
	return s
}

// parseSQL reads every statement of the .sql files of fsys's sql directory.
func parseSQL(fsys fs.FS) (*sqlSet, error) {
	s := &sqlSet{tmpl: template.New("").Option("missingkey=error"), params: map[string][]string{}, files: map[string]string{}}
	paths, err := fs.Glob(fsys, "sql/*.sql")
	if err != nil {
		return nil, err
	}
	for _, path := range paths {
		data, err := fs.ReadFile(fsys, path)
		if err != nil {
			return nil, err
		}
		if err := s.parseFile(path, string(data)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// parseFile adds the statements of the file at path.
func (s *sqlSet) parseFile(path, data string) error {
	var name string
	var body []string
	doc := false
	flush := func() error {
		if name == "" {
			return nil
		}
		for len(body) > 0 && (strings.HasPrefix(body[len(body)-1], "--") || strings.TrimSpace(body[len(body)-1]) == "") {
			body = body[:len(body)-1] // the next section's comment
		}
		text := strings.TrimRight(strings.Join(body, "\n"), " \t")
		if text == "" {
			return fmt.Errorf("%s: statement %s is empty", path, name)
		}
		if _, err := s.tmpl.New(name).Parse(text); err != nil {
			return fmt.Errorf("%s: statement %s: %w", path, name, err)
		}
		return nil
	}
	for line := range strings.Lines(data) {
		line = strings.TrimSuffix(line, "\n")
		m := sqlMarker.FindStringSubmatch(line)
		switch {
		case m != nil:
			if err := flush(); err != nil {
				return err
			}
			name, body, doc = m[1], nil, true
			if prev, ok := s.files[name]; ok {
				return fmt.Errorf("%s: statement %s is also in %s", path, name, prev)
			}
			s.files[name] = path
			for _, p := range strings.Fields(m[2]) {
				s.params[name] = append(s.params[name], p[1:])
			}
		case strings.HasPrefix(line, "-- name:"):
			return fmt.Errorf("%s: malformed marker %q", path, line)
		case name == "" || doc && (strings.HasPrefix(line, "--") || strings.TrimSpace(line) == ""):
			// the file's header, or the statement's own comment
		default:
			doc = false
			body = append(body, line)
		}
	}
	return flush()
}

// Data is what a statement's template reads.
type Data struct {
	Table       string // the quoted, possibly schema-qualified table
	Backoff     bool   // Config.RetryBackoff is set
	Async       bool   // Config.AsyncCommit
	Partitioned bool   // only this replica's partitions
	Wake        bool   // Enqueue's insert also notifies
	Headers     bool   // the table has the optional headers column: read or write it
	Keyed       bool   // the table has the key index: lanes share the batch by turns, rows are probed by key
	OneLane     bool   // the select takes one lane's rows: its window whole
	Requeued    bool   // the table has the optional requeued_at column: read or write it

	// Per use of a fragment.
	Alias    string // the row alias a fragment reads ("m", "e")
	Attempts string // the attempts predicate of a branch of failed rows

	// The DDL's names (quoted) and literals; the election's lock functions.
	OutboxIndex, PendingIndex, ErrorIndex, RetryIndex, KeyIndex string
	Registry                                                    string // the table's registry of types (registry.go); "" when it has none
	Function, Channel                                           string
	Since                                                       string
	Lock, Unlock                                                string
	InlinePayloadMax                                            int
}

// As is d for a fragment that reads the rows of alias.
func (d Data) As(alias string) Data { d.Alias = alias; return d }

// Failing is d for the branch of failed rows whose attempts match attempts.
func (d Data) Failing(attempts string) Data { d.Attempts = attempts; return d }

// text renders statement name for d. A statement that does not render is a
// bug of the package: it panics.
func (s *sqlSet) Text(name string, d Data) string {
	var b strings.Builder
	if err := s.tmpl.ExecuteTemplate(&b, name, d); err != nil {
		panic("relay: statement " + name + ": " + err.Error())
	}
	return b.String()
}

// named renders statement name for d and numbers its parameters.
func (s *sqlSet) Named(name string, d Data) NamedSQL {
	return numbered(s.Text(name, d), s.params[name])
}

// positional renders statement name for d and numbers its parameters, for a
// caller that passes its arguments in the order of the statement's marker.
func (s *sqlSet) Positional(name string, d Data) string {
	return s.Named(name, d).sql
}

// NamedSQL is a statement whose parameters were named ("@max") and numbered
// ($1) by numbered.
type NamedSQL struct {
	sql   string
	names []string
}

var paramName = regexp.MustCompile(`@[a-z][a-z0-9_]*`)

// numbered numbers the named parameters of a statement: those of order
// first, in its order, then the others in order of first appearance.
func numbered(text string, order []string) NamedSQL {
	var n NamedSQL
	index := map[string]int{}
	for _, name := range order {
		n.names = append(n.names, name)
		index["@"+name] = len(n.names)
	}
	n.sql = paramName.ReplaceAllStringFunc(text, func(name string) string {
		i, ok := index[name]
		if !ok {
			n.names = append(n.names, name[1:])
			i = len(n.names)
			index[name] = i
		}
		return "$" + strconv.Itoa(i)
	})
	return n
}

// args orders values by the statement's parameters; a name it lacks is a
// bug, and panics.
func (n NamedSQL) Args(values map[string]any) []any {
	args := make([]any, len(n.names))
	for i, name := range n.names {
		v, ok := values[name]
		if !ok {
			panic("relay: no value for the statement's parameter @" + name)
		}
		args[i] = v
	}
	return args
}

// Files maps each statement's name to its file (TestSQLFiles).
func (s *sqlSet) Files() map[string]string { return s.files }

// Params maps each statement's name to its listed parameters (TestSQLFiles).
func (s *sqlSet) Params() map[string][]string { return s.params }

// SQL is the statement's text, its parameters numbered.
func (n NamedSQL) SQL() string { return n.sql }

// Names are the statement's parameters, in the order of their numbers.
func (n NamedSQL) Names() []string { return n.names }
