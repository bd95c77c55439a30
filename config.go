package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/xadm/relay/internal/pass"
	"github.com/xadm/relay/internal/store"
)

// Defaults of [Config], as [DefaultConfig] fills them in (each field's doc
// says its own).
const (
	appNameDefault = "app"
	// TableDefault is the default of [Config.Table]: the JVM relay's table.
	TableDefault     = "mensagem_m2m"
	intervalDefault  = time.Second
	batchSizeDefault = 100
	// MaxAttemptsDefault is the default of [Config.MaxAttempts].
	MaxAttemptsDefault  = 10
	retryBackoffDefault = 2 * time.Second
	sendTimeoutDefault  = 30 * time.Second
	concurrencyDefault  = 1
	asyncCommitDefault  = true
	batchBytesDefault   = 64 << 20
	wakeOnCommitDefault = true
	pauseAfterDefault   = 5

	// retryBackoffMax caps the wait before an ERROR row is retried, however
	// many attempts it has.
	retryBackoffMax = time.Hour
)

// LockKeySuffix is appended to [Config.AppName] to form the election key,
// exactly as the JVM relay forms it: hashtext(AppName || '_relay_m2m').
const LockKeySuffix = "_relay_m2m"

// Upper bounds that catch a misplaced digit before it reaches production, or
// that the table's columns impose.
const (
	batchSizeMax   = 10_000
	concurrencyMax = 1_000
	// maxAttemptsMax is the most attempts the integer column can count.
	maxAttemptsMax = math.MaxInt32
	// batchBytesMin keeps the byte bound from refusing ordinary messages.
	batchBytesMin = 64 << 10
	// batchBytesMax is PostgreSQL's own limit on one value.
	batchBytesMax = 1 << 30
	// pauseAfterMax bounds PauseAfter: a type that fails this often in a row
	// is sick, whatever the setting meant.
	pauseAfterMax = 1_000
	// pauseMaxMin is the shortest PauseMax: the first pause lasts this long.
	pauseMaxMin = 5 * time.Second
	// stuckSendsMaxMax bounds StuckSendsMax: each stuck Send holds a
	// goroutine and its message.
	stuckSendsMaxMax = 100_000
)

// Config configures a [Relay]. Build it with [DefaultConfig] or [ConfigFromEnv]
// and change the fields you need: [New] refuses a Config built any other way,
// because the safe default of ClusterLock (true) cannot survive Go's zero value.
// Each field's doc names its default and the variable [ConfigFromEnv] reads
// it from.
type Config struct {
	// AppName names the app. Replicas of one app share it, and the election
	// key is AppName + "_relay_m2m", so a JVM replica of the same app excludes
	// this one and the other way round. Defaults to "app". Environment:
	// RELAY_APP_NAME.
	AppName string

	// Table is the outbox table, optionally schema-qualified ("outbox.mensagem_m2m").
	// Each part is an identifier of letters, digits and underscores; it is quoted
	// in SQL, so it is case-sensitive. Defaults to "mensagem_m2m" ([TableDefault]).
	// Environment: RELAY_TABLE.
	Table string

	// Enabled gates the periodic tick started by [Relay.Start]. It does not
	// apply to [Relay.Run] or [Relay.RunIfElected]. Defaults to true.
	// Environment: RELAY_ENABLED.
	Enabled bool

	// ClusterLock runs every periodic pass, and [Relay.RunIfElected], under the
	// per-app election. false is the escape hatch: every replica drains at the
	// same time and the avoidable duplication of decision 0035 is back (the
	// relay logs a warning). Defaults to true. Environment: RELAY_CLUSTER_LOCK.
	ClusterLock bool

	// Interval is the delay from the end of one periodic pass to the start of
	// the next; a pass that finds a backlog keeps taking batches under its
	// election instead of waiting. Defaults to 1s. Environment: RELAY_INTERVAL.
	Interval time.Duration

	// BatchSize is the most rows one batch selects. Defaults to 100.
	// Environment: RELAY_BATCH_SIZE.
	BatchSize int

	// BatchBytes bounds the payload bytes one batch holds in memory, whatever
	// BatchSize says: a batch of large rows is cut short, and the rows left
	// wait for the next batch. A row whose payload alone is larger is never
	// sent: it is marked dead, with a last_error saying its size. Between 64
	// KiB and 1 GiB. Defaults to 64 MiB. Environment: RELAY_BATCH_BYTES (bytes).
	BatchBytes int

	// MaxAttempts is the ceiling: a row whose attempts reached it is dead and
	// never selected again until an operator re-queues it. At most
	// 2147483647, what the integer column counts. Defaults to 10
	// ([MaxAttemptsDefault]). Environment: RELAY_MAX_ATTEMPTS.
	MaxAttempts int

	// RetryBackoff is the base of the wait before an ERROR row is retried:
	// RetryBackoff * 2^(attempts-1) after its last attempt (updated_at), capped
	// at an hour. With the defaults (2s, MaxAttempts 10) a message
	// is tried at 0, 2, 6, 14, 30, 62, 126, 254 and 510 seconds and dies only
	// at 1022 s: a destination that is down for 15 minutes loses nothing. 0
	// retries on the next pass, as the JVM relay does (its "next pass"): with
	// MaxAttempts 10 and Interval 1s, an outage of ten seconds then leaves its
	// messages dead. Defaults to 2s. Environment: RELAY_RETRY_BACKOFF.
	RetryBackoff time.Duration

	// SendTimeout bounds one [Sender.Send]. A send that has not returned by then
	// marks its row ERROR and the batch goes on. Defaults to 30s.
	// Environment: RELAY_SEND_TIMEOUT.
	SendTimeout time.Duration

	// Concurrency is how many messages of a batch may be in flight at once,
	// all under the one election. Messages with the same natural key are never
	// in flight together and go in id order; after one fails, the later ones of
	// its key wait for a later pass. Give the pool Concurrency + 2 connections.
	// Defaults to 1. Environment: RELAY_CONCURRENCY.
	Concurrency int

	// GroupOutcomes chooses how outcomes are recorded. 0, the default, is
	// adaptive (docs/decisions/0037-adaptive-outcomes.md): each worker writes
	// its outcomes as soon as its last write returned, one alone in its own
	// transaction while they trickle, and what queued meanwhile together in
	// one statement under a backlog; a crash re-delivers at most 64 sent
	// messages per worker beyond the one in flight. 1 records each outcome in
	// its own short transaction (at most 8 waiting per worker), as decision
	// 0035 describes. Above 1, up to that many outcomes are recorded in one
	// statement, at most 100ms after the first of them, a full group while
	// the workers go on sending: a crash re-delivers at most 2 × GroupOutcomes
	// messages in groups (and 8 per worker on their way to the group), at
	// most 100ms and one write's worth. Whichever is chosen,
	// each row is fenced on the state the pass read, and a failure still marks
	// only its own row. Defaults to 0. Environment: RELAY_GROUP_OUTCOMES.
	GroupOutcomes int

	// AsyncCommit commits the outcome transactions with synchronous_commit =
	// off: each outcome still commits in its own short transaction, but does
	// not wait for its WAL flush. Only outcomes are affected, never the
	// messages (their producers' transactions keep the server's setting). A
	// crash of the database (not of the relay) then forgets at most the last
	// 3 × wal_writer_delay of outcomes (600ms by default) and their messages
	// are delivered again: the same duplication as a relay crash between the
	// destination's answer and the commit, still at-least-once, nothing lost.
	// It delivers about 1.6 times as fast with one transaction per outcome
	// (docs/performance.md). Defaults to true; false waits for every flush.
	// Environment: RELAY_ASYNC_COMMIT.
	AsyncCommit bool

	// WakeOnCommit makes the started relay LISTEN for the NOTIFY that [Enqueue]
	// (or [WakeTriggerSQL]'s trigger) sends when a producer commits a message,
	// and pass at once instead of at the next Interval: milliseconds from a
	// commit to its Send. It needs a connection of its own (one more than
	// Concurrency + 2) and session pooling; behind a transaction-pooling
	// proxy the relay finds out, says so once, and polls. Passes still run
	// every Interval, for rows written without a NOTIFY. Defaults to true.
	// Environment: RELAY_WAKE_ON_COMMIT.
	WakeOnCommit bool

	// Partitions splits the election so that several replicas deliver at
	// once. 1, the default, is one election for the whole app, exactly the
	// JVM relay's: one replica delivers at a time. With N > 1 each row
	// belongs to one of N partitions by a hash of its natural key, so a key's
	// messages share a partition and keep their order, and the started
	// replicas share the partitions out between them, each delivering only
	// its own. Every partitioned replica holds the app's election key in
	// shared mode, so a JVM relay (or a replica with Partitions 1) is never
	// elected while one delivers, nor the other way round; and replicas run
	// with one N at a time: a replica with another N takes no partition until
	// the last holder of the old ones has stopped (docs/architecture.md,
	// decision 0036). It needs ClusterLock and the relay's own election (no
	// Guard), and one more connection than Concurrency + 2 per replica: the
	// membership's session, held for as long as the relay runs. At most
	// 4096. Defaults to 1. Environment: RELAY_PARTITIONS.
	Partitions int

	// PauseAfter pauses a message type whose Sends failed that many times in a
	// row (a timeout, a 5xx, a refused connection; not a [Permanent] refusal,
	// which is the message's fault): the type's rows are then neither
	// selected nor sent, and keep their status and attempts, while the
	// others go on (docs/decisions/0040-isolation.md). The pause lasts 5s,
	// doubling with each pause in a row up to PauseMax; then one message of
	// the type is sent as a probe, each time of another key when it can, and
	// its success resumes the type. 0 never pauses on failures. At most 1000.
	// Defaults to 5. Environment: RELAY_PAUSE_AFTER.
	PauseAfter int

	// PauseMax is the longest pause of a type (PauseAfter): a dead destination
	// gets one probe that often, and a destination that came back is
	// delivered to again within about that much. Between 5s and 1h. Defaults
	// to 10s. Environment: RELAY_PAUSE_MAX.
	PauseMax time.Duration

	// StuckSendsMax bounds the relay's stuck Sends: Sends that ignored their
	// context past SendTimeout, which the relay gives up on (their messages
	// fail with the context's cause) and whose goroutines run on, each with
	// its message, until they return. A stuck Send holds its key: no other
	// message of the key is sent until it returns; the type's other keys go
	// on. At the bound, the type whose Send reached it is paused, and probed
	// again only once fewer run; status is not OK while any runs. Between 1
	// and 100,000. Defaults to 100. Environment: RELAY_STUCK_SENDS_MAX.
	StuckSendsMax int

	// Retention, above 0, makes the started relay purge the SENT rows of its
	// own types delivered longer ago than Retention, as an elected job on
	// RetentionSchedule: one replica of the app runs each occurrence, in
	// chunks of [PurgeChunk] rows (retention.go). 0, the default, keeps every
	// SENT row: the table may be another system's too. Environment:
	// RELAY_RETENTION (a duration, or days: "30d").
	Retention time.Duration

	// RetentionSchedule is when the retention job runs, a cron spec as
	// [Scheduler.Add] reads it. Defaults to "@hourly". Environment:
	// RELAY_RETENTION_SCHEDULE.
	RetentionSchedule string

	// Logger receives the relay's logs. Defaults to [slog.Default]. No
	// environment variable (nor for Guard and Observer).
	Logger *slog.Logger

	// Guard runs the elected pass. nil means a [PostgresGuard] on the relay's pool.
	Guard Guard

	// Observer, if set, receives every pass's and message's outcome, to export
	// metrics. nil means none.
	Observer Observer

	// built is set only by DefaultConfig, so New can tell a Config that
	// started from the defaults from a zero value with ClusterLock silently false.
	built bool
}

// DefaultConfig returns a Config with every default filled in.
func DefaultConfig() Config {
	return Config{
		AppName:       appNameDefault,
		Table:         TableDefault,
		Enabled:       true,
		ClusterLock:   true,
		Interval:      intervalDefault,
		BatchSize:     batchSizeDefault,
		MaxAttempts:   MaxAttemptsDefault,
		BatchBytes:    batchBytesDefault,
		WakeOnCommit:  wakeOnCommitDefault,
		RetryBackoff:  retryBackoffDefault,
		SendTimeout:   sendTimeoutDefault,
		Concurrency:   concurrencyDefault,
		AsyncCommit:   asyncCommitDefault,
		Partitions:    1,
		PauseAfter:    pauseAfterDefault,
		PauseMax:      pass.PauseMaxDefault,
		StuckSendsMax: pass.StuckSendsMaxDefault,
		built:         true,

		RetentionSchedule: retentionScheduleDefault,
	}
}

// errConfigNotBuilt is returned by New for a Config that did not start from DefaultConfig.
var errConfigNotBuilt = errors.New("relay: Config was not built by relay.DefaultConfig() or relay.ConfigFromEnv(); " +
	"start from cfg := relay.DefaultConfig() and change the fields you need, so that ClusterLock defaults to true")

func (c *Config) validate() error {
	if !c.built {
		return errConfigNotBuilt
	}
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, msg: fmt.Sprintf(format, args...)})
	}
	if msg := checkAppName(c.AppName); msg != "" {
		bad("AppName", "%s", msg)
	}
	if _, err := store.ParseTable(c.Table); err != nil {
		bad("Table", "%v", err)
	}
	if c.Interval <= 0 {
		bad("Interval", "must be positive, got %s", c.Interval)
	}
	if c.BatchSize < 1 || c.BatchSize > batchSizeMax {
		bad("BatchSize", "must be between 1 and %d, got %d", batchSizeMax, c.BatchSize)
	}
	if c.MaxAttempts < 1 || c.MaxAttempts > maxAttemptsMax {
		bad("MaxAttempts", "must be between 1 and %d (what the attempts column counts), got %d", maxAttemptsMax, c.MaxAttempts)
	}
	if c.BatchBytes < batchBytesMin || c.BatchBytes > batchBytesMax {
		bad("BatchBytes", "must be between %d and %d bytes, got %d", batchBytesMin, batchBytesMax, c.BatchBytes)
	}
	if c.RetryBackoff < 0 {
		bad("RetryBackoff", "must not be negative, got %s", c.RetryBackoff)
	}
	if c.SendTimeout <= 0 {
		bad("SendTimeout", "must be positive, got %s", c.SendTimeout)
	}
	if c.Concurrency < 1 || c.Concurrency > concurrencyMax {
		bad("Concurrency", "must be between 1 and %d, got %d", concurrencyMax, c.Concurrency)
	}
	if c.PauseAfter < 0 || c.PauseAfter > pauseAfterMax {
		bad("PauseAfter", "must be between 0 (never pause) and %d, got %d", pauseAfterMax, c.PauseAfter)
	}
	if c.PauseMax < pauseMaxMin || c.PauseMax > time.Hour {
		bad("PauseMax", "must be between %s and 1h, got %s", pauseMaxMin, c.PauseMax)
	}
	if c.StuckSendsMax < 1 || c.StuckSendsMax > stuckSendsMaxMax {
		bad("StuckSendsMax", "must be between 1 and %d, got %d", stuckSendsMaxMax, c.StuckSendsMax)
	}
	if c.GroupOutcomes < 0 || c.GroupOutcomes > batchSizeMax {
		bad("GroupOutcomes", "must be between 0 and %d, got %d", batchSizeMax, c.GroupOutcomes)
	}
	if c.Retention < 0 {
		bad("Retention", "must not be negative (0 keeps every SENT row), got %s", c.Retention)
	}
	if c.Retention > 0 && strings.TrimSpace(c.RetentionSchedule) == "" {
		bad("RetentionSchedule", "must be a cron spec (@hourly, \"15 3 * * *\") when Retention is set")
	}
	switch {
	case c.Partitions < 1 || c.Partitions > partitionsMax:
		bad("Partitions", "must be between 1 and %d, got %d", partitionsMax, c.Partitions)
	case c.Partitions > 1 && !c.ClusterLock:
		bad("Partitions", "is %d, but ClusterLock is false: partitions share out the election, and without it every replica delivers every row", c.Partitions)
	case c.Partitions > 1 && c.Guard != nil:
		bad("Partitions", "is %d, which needs the relay's own election: leave Guard nil (a Guard elects one replica for the whole app)", c.Partitions)
	}
	return errors.Join(errs...)
}

// partitionsMax bounds Config.Partitions: a partition's lock keeps N and its
// number in 16 bits each (internal/election).
const partitionsMax = 4096

// checkAppName says what is wrong with an AppName, "" if nothing. The name is
// the election: "billing" and "billing " would be two elections, and replicas
// that differ by a space would deliver the same rows at the same time. So a
// name with surrounding white space, control characters or invalid UTF-8 is
// refused rather than quietly trimmed.
func checkAppName(name string) string {
	switch {
	case strings.TrimSpace(name) == "":
		return "must not be empty: it names the election key"
	case !utf8.ValidString(name):
		return fmt.Sprintf("%q is not valid UTF-8: PostgreSQL cannot hash it into the election key", name)
	case strings.TrimSpace(name) != name:
		return fmt.Sprintf("%q has leading or trailing white space: %q and %q would be two elections", name, name, strings.TrimSpace(name))
	case strings.ContainsFunc(name, unicode.IsControl):
		return fmt.Sprintf("%q has control characters (NUL, newline, ...)", name)
	}
	return ""
}

// FieldError is a [Config] field with a value [New] refuses.
type FieldError struct {
	Field string // the Config field, as in "BatchSize"
	msg   string
}

func (e *FieldError) Error() string { return "relay: Config." + e.Field + " " + e.msg }

// lockKey is the election key, as the JVM relay forms it.
func (c *Config) lockKey() string { return c.AppName + LockKeySuffix }

// The environment variables read by ConfigFromEnv (each Config field's doc
// names its own).
const (
	envAppName       = "RELAY_APP_NAME"
	envTable         = "RELAY_TABLE"
	envEnabled       = "RELAY_ENABLED"
	envClusterLock   = "RELAY_CLUSTER_LOCK"
	envInterval      = "RELAY_INTERVAL"
	envBatchSize     = "RELAY_BATCH_SIZE"
	envBatchBytes    = "RELAY_BATCH_BYTES"
	envMaxAttempts   = "RELAY_MAX_ATTEMPTS"
	envRetryBackoff  = "RELAY_RETRY_BACKOFF"
	envSendTimeout   = "RELAY_SEND_TIMEOUT"
	envConcurrency   = "RELAY_CONCURRENCY"
	envGroupOutcomes = "RELAY_GROUP_OUTCOMES"
	envAsyncCommit   = "RELAY_ASYNC_COMMIT"
	envWakeOnCommit  = "RELAY_WAKE_ON_COMMIT"
	envPartitions    = "RELAY_PARTITIONS"
	envPauseAfter    = "RELAY_PAUSE_AFTER"
	envPauseMax      = "RELAY_PAUSE_MAX"
	envStuckSendsMax = "RELAY_STUCK_SENDS_MAX"
	envRetention     = "RELAY_RETENTION"
	envRetentionCron = "RELAY_RETENTION_SCHEDULE"
)

// ConfigFromEnv returns [DefaultConfig] with every RELAY_* variable that is set
// applied on top, so an operator can flip the escape hatch (RELAY_CLUSTER_LOCK=false)
// without a release. Booleans take strconv.ParseBool's forms ("true", "false",
// "1", "0"), durations time.ParseDuration's ("500ms", "30s"). A malformed value
// is an error that names the variable; unset and empty variables keep the default.
func ConfigFromEnv() (Config, error) {
	return configFromLookup(os.LookupEnv)
}

func configFromLookup(lookup func(string) (string, bool)) (Config, error) {
	cfg := DefaultConfig()
	e := envReader{lookup: lookup}
	envVar(&e, envAppName, &cfg.AppName, parseString, "")
	envVar(&e, envTable, &cfg.Table, parseString, "")
	envVar(&e, envEnabled, &cfg.Enabled, strconv.ParseBool, "a boolean (use true or false)")
	envVar(&e, envClusterLock, &cfg.ClusterLock, strconv.ParseBool, "a boolean (use true or false)")
	envVar(&e, envInterval, &cfg.Interval, time.ParseDuration, durationWant)
	envVar(&e, envBatchSize, &cfg.BatchSize, strconv.Atoi, "an integer")
	envVar(&e, envBatchBytes, &cfg.BatchBytes, strconv.Atoi, "an integer (bytes)")
	envVar(&e, envMaxAttempts, &cfg.MaxAttempts, strconv.Atoi, "an integer")
	envVar(&e, envRetryBackoff, &cfg.RetryBackoff, time.ParseDuration, durationWant)
	envVar(&e, envSendTimeout, &cfg.SendTimeout, time.ParseDuration, durationWant)
	envVar(&e, envConcurrency, &cfg.Concurrency, strconv.Atoi, "an integer")
	envVar(&e, envGroupOutcomes, &cfg.GroupOutcomes, strconv.Atoi, "an integer")
	envVar(&e, envAsyncCommit, &cfg.AsyncCommit, strconv.ParseBool, "a boolean (use true or false)")
	envVar(&e, envWakeOnCommit, &cfg.WakeOnCommit, strconv.ParseBool, "a boolean (use true or false)")
	envVar(&e, envPartitions, &cfg.Partitions, strconv.Atoi, "an integer")
	envVar(&e, envPauseAfter, &cfg.PauseAfter, strconv.Atoi, "an integer")
	envVar(&e, envPauseMax, &cfg.PauseMax, time.ParseDuration, durationWant)
	envVar(&e, envStuckSendsMax, &cfg.StuckSendsMax, strconv.Atoi, "an integer")
	envVar(&e, envRetention, &cfg.Retention, parseAge, "a duration or a number of days (as in 30d, 720h)")
	envVar(&e, envRetentionCron, &cfg.RetentionSchedule, parseString, "")
	errs := e.errs
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	if err := cfg.validate(); err != nil {
		return Config{}, fmt.Errorf("%w (from the environment: %s)", err, envNames(err))
	}
	return cfg, nil
}

// envReader reads RELAY_* variables and collects what it cannot parse.
type envReader struct {
	lookup func(string) (string, bool)
	errs   []error
}

const durationWant = "a duration (use a unit, as in 500ms or 30s)"

func parseString(v string) (string, error) { return v, nil }

// parseAge reads a duration, or a number of days ("30d").
func parseAge(v string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 || n*24*float64(time.Hour) >= math.MaxInt64 {
			return 0, fmt.Errorf("not a number of days: %q", v)
		}
		return time.Duration(n * 24 * float64(time.Hour)), nil
	}
	return time.ParseDuration(v)
}

// envVar sets *dst from the variable name when it is set and not blank; a
// value parse refuses is an error naming the variable and what it wants.
func envVar[T any](e *envReader, name string, dst *T, parse func(string) (T, error), want string) {
	v, ok := e.lookup(name)
	if v = strings.TrimSpace(v); !ok || v == "" {
		return
	}
	x, err := parse(v)
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("relay: %s=%q is not %s", name, v, want))
		return
	}
	*dst = x
}

// envNames names the variables behind the fields that err refuses.
func envNames(err error) string {
	vars := map[string]string{
		"AppName": envAppName, "Table": envTable, "Interval": envInterval, "BatchSize": envBatchSize, "BatchBytes": envBatchBytes,
		"MaxAttempts": envMaxAttempts, "RetryBackoff": envRetryBackoff, "SendTimeout": envSendTimeout,
		"Concurrency": envConcurrency, "GroupOutcomes": envGroupOutcomes, "Partitions": envPartitions,
		"PauseAfter": envPauseAfter, "PauseMax": envPauseMax, "StuckSendsMax": envStuckSendsMax,
		"Retention": envRetention, "RetentionSchedule": envRetentionCron,
	}
	var names []string
	joined, ok := err.(interface{ Unwrap() []error })
	if !ok {
		return ""
	}
	for _, e := range joined.Unwrap() {
		var fe *FieldError
		if errors.As(e, &fe) {
			names = append(names, vars[fe.Field])
		}
	}
	return strings.Join(names, ", ")
}
