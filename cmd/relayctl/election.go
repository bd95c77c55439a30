package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

func runWho(ctx context.Context, e *env) int {
	holders, err := e.admin.Election(ctx)
	if err != nil {
		return e.fail(err)
	}
	reps, err := e.admin.Replicas(ctx)
	if err != nil {
		return e.fail(err)
	}
	if e.o.json {
		err := writeJSON(e.stdout, struct {
			App      string        `json:"app"`
			Key      string        `json:"key"`
			Election []jsonHolder  `json:"election"`
			Replicas []jsonReplica `json:"replicas"`
		}{e.cfg.AppName, e.cfg.AppName + relay.LockKeySuffix, holdersJSON(holders), replicasJSON(reps)})
		if err != nil {
			return e.fail(err)
		}
		return exitOK
	}
	printElection(e, e.cfg.AppName, holders)
	printReplicas(e, e.cfg.AppName, reps)
	return exitOK
}

// The pause's SQL: the lock exactly as a JVM relay takes it, on a session of
// its own named pauseName(app), so that Admin.Election reports it as a pause.
const (
	pauseLockSQL   = `SELECT pg_try_advisory_lock(hashtext($1 || '_relay_m2m'))`
	pauseUnlockSQL = `SELECT pg_advisory_unlock(hashtext($1 || '_relay_m2m'))`
	// pauseWaitSQL queues for the lock, under the session's lock_timeout.
	pauseWaitSQL = `SELECT pg_advisory_lock(hashtext($1 || '_relay_m2m'))`
	// The sessions of app's pauses in this database that hold the app's key
	// or wait for it: a pause's session that has just ended (a pause that
	// gave up) may linger in pg_stat_activity a moment, holding nothing.
	pauseSessionsSQL = `SELECT a.pid FROM pg_stat_activity a
WHERE a.datname = current_database() AND a.application_name = $1 AND a.pid <> pg_backend_pid()
  AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.objsubid = 1
    AND l.classid = ((hashtext($2 || '_relay_m2m')::bigint >> 32) & 4294967295)::oid
    AND l.objid = (hashtext($2 || '_relay_m2m')::bigint & 4294967295)::oid)
ORDER BY a.pid`
	terminateSQL = `SELECT pg_terminate_backend($1)`
)

// pauseName is the application_name of app's pause session, cut as
// PostgreSQL cuts it (63 bytes), which relay.Admin.Election recognises.
func pauseName(app string) string {
	n := "relayctl pause " + app
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}

// Timings of pause.
const (
	pauseTick      = 500 * time.Millisecond // how often the holding loop looks at Ctrl-C and --for
	pauseHeartbeat = 2 * time.Second        // a statement on the session, so idle timeouts and dead peers show
	releaseTimeout = 5 * time.Second
)

func pauseFlags(fs *flag.FlagSet, o *opts) {
	fs.DurationVar(&o.holdFor, "for", 0, "end the pause by itself after this long (e.g. 15m); 0 holds until Ctrl-C or relayctl resume")
	fs.DurationVar(&o.wait, "wait", 30*time.Second,
		"how long to wait in line while another session holds the election (a relay's pass ends within seconds, and partitioned replicas step aside at their next pass)")
}

func runPause(ctx context.Context, e *env) int {
	if e.o.holdFor < 0 {
		return e.usageErr("--for must not be negative, got %s", e.o.holdFor)
	}
	if e.o.wait < 0 {
		return e.usageErr("--wait must not be negative, got %s", e.o.wait)
	}
	app := e.cfg.AppName
	cc, err := pgx.ParseConfig(e.o.databaseURL)
	if err != nil {
		return e.fail(fmt.Errorf("DATABASE_URL: %w", err))
	}
	cc.RuntimeParams["application_name"] = pauseName(app)
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = connectTimeout
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return e.fail(fmt.Errorf("connect: %w", err))
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		_ = conn.Close(cctx)
	}()

	// Try once, as a relay does; if another session holds the election, queue
	// for it, up to --wait: a relay's pass ends within seconds and the
	// queued request is granted then. While it waits, the relays of the app
	// step aside: a request that conflicts with a waiting one waits behind
	// it, so no relay wins the election again, and partitioned replicas,
	// which hold the key shared for as long as they run, leave it when they
	// see the request (decision 0036).
	// The answer is awaited whatever ctx says: the server may have granted
	// the lock already, and an interrupt then releases it (hold, below).
	var locked bool
	tctx, tcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	err = conn.QueryRow(tctx, pauseLockSQL, app).Scan(&locked)
	tcancel()
	if err != nil {
		return e.fail(fmt.Errorf("take the election of app %q: %w", app, err))
	}
	if !locked {
		holders, err := e.admin.Election(ctx)
		if err != nil {
			return e.fail(err)
		}
		if e.o.wait > 0 {
			fprintf(e.stderr, "waiting up to %s for the election of app %q:\n", e.o.wait, app)
			printElectionTo(e, holders)
			err = waitForLock(ctx, conn, app, e.o.wait)
		}
		var pgErr *pgconn.PgError
		switch {
		case e.o.wait > 0 && err == nil:
		case ctx.Err() != nil:
			fprintf(e.stderr, "relayctl: not paused: interrupted while waiting\n")
			return exitError
		case e.o.wait == 0 || errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available: --wait elapsed
			if e.o.wait > 0 {
				if holders, err = e.admin.Election(ctx); err != nil {
					return e.fail(err)
				}
			}
			fprintf(e.stderr, "relayctl: not paused: the election of app %q is held by another session:\n", app)
			printElectionTo(e, holders)
			if h := firstGranted(holders); h != nil && h.Kind == relay.HolderPause {
				fprintf(e.stderr, "It is already paused.\n")
			} else {
				fprintf(e.stderr, "Try again (a relay's pass ends within seconds), or find out why it holds it: relayctl status.\n")
			}
			return exitHeld
		default:
			return e.fail(fmt.Errorf("wait for the election of app %q: %w", app, err))
		}
	}

	// Held: an interrupt from now on releases it (hold, below), so this
	// statement runs whatever ctx says.
	var pid uint32
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer pcancel()
	if err := conn.QueryRow(pctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return e.fail(err)
	}
	start := time.Now()
	until := "until Ctrl-C or relayctl resume"
	if e.o.holdFor > 0 {
		until = fmt.Sprintf("for %s (or until Ctrl-C or relayctl resume)", e.o.holdFor)
	}
	fprintf(e.stdout, "paused: this session (pid %d, application_name %q) holds the election of app %q %s; no relay of the app delivers meanwhile\n",
		pid, pauseName(app), app, until)

	why, err := hold(ctx, conn.PgConn(), e.o.holdFor)
	held := diagnose.Duration(time.Since(start))
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "57P01" {
			fprintf(e.stdout, "resumed: the pause's session was ended from elsewhere (relayctl resume or pg_terminate_backend) after %s\n", held)
			return exitOK
		}
		return e.fail(fmt.Errorf("the pause's session was lost after %s, which frees the election: %w", held, err))
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	var unlocked bool
	if err := conn.QueryRow(rctx, pauseUnlockSQL, app).Scan(&unlocked); err != nil || !unlocked {
		// Closing the session (deferred) frees it anyway.
		fprintf(e.stderr, "relayctl: unlock: %v (closing the session frees the election)\n", err)
	}
	fprintf(e.stdout, "resumed: %s; released the election of app %q after %s\n", why, app, held)
	return exitOK
}

// waitForLock queues for app's election for at most wait: lock_timeout ends
// the request with lock_not_available (55P03) if it is not granted by then.
func waitForLock(ctx context.Context, conn *pgx.Conn, app string, wait time.Duration) error {
	if _, err := conn.Exec(ctx, `SELECT set_config('lock_timeout', $1, false)`, fmt.Sprint(max(wait.Milliseconds(), 1))); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, pauseWaitSQL, app); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, `SELECT set_config('lock_timeout', '0', false)`)
	return err
}

// hold keeps the session until ctx ends or holdFor elapses (0: never), and
// says which. It blocks reading the session, so the server's goodbye when the
// session is terminated (relayctl resume) ends it at once with that error; a
// heartbeat every few seconds catches a connection that died silently.
func hold(ctx context.Context, c *pgconn.PgConn, holdFor time.Duration) (string, error) {
	var end <-chan time.Time
	if holdFor > 0 {
		t := time.NewTimer(holdFor)
		defer t.Stop()
		end = t.C
	}
	lastBeat := time.Now()
	for {
		select {
		case <-ctx.Done():
			return "interrupted", nil
		case <-end:
			return fmt.Sprintf("--for %s elapsed", holdFor), nil
		default:
		}
		_ = c.Conn().SetReadDeadline(time.Now().Add(pauseTick))
		err := c.WaitForNotification(context.Background())
		_ = c.Conn().SetReadDeadline(time.Time{})
		switch {
		case err == nil:
		case !pgconn.Timeout(err):
			return "", err
		case time.Since(lastBeat) >= pauseHeartbeat:
			hctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			err := c.Exec(hctx, "SELECT 1").Close()
			cancel()
			if err != nil {
				return "", err
			}
			lastBeat = time.Now()
		}
	}
}

func runResume(ctx context.Context, e *env) int {
	app := e.cfg.AppName
	holders, err := e.admin.Election(ctx)
	if err != nil {
		return e.fail(err)
	}
	rows, err := e.pool.Query(ctx, pauseSessionsSQL, pauseName(app), app)
	if err != nil {
		return e.fail(err)
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return e.fail(err)
	}
	if len(pids) == 0 {
		h := firstGranted(holders)
		switch {
		case h == nil:
			fprintf(e.stdout, "not paused: nobody holds the election of app %q right now\n", app)
			return exitOK
		case h.Kind == relay.HolderRelay:
			fprintf(e.stdout, "not paused: %s holds the election of app %q: it is delivering\n", diagnose.Holder(*h), app)
			return exitOK
		default:
			fprintf(e.stdout, "not paused by relayctl: the election of app %q is held by %s.\n"+
				"relayctl resume ends only relayctl's pauses. If it is a JVM relay, it is delivering; if that session "+
				"must go, end it with SELECT pg_terminate_backend(%d).\n", app, diagnose.Holder(*h), h.PID)
			return exitHeld
		}
	}
	for _, pid := range pids {
		var ok bool
		if err := e.pool.QueryRow(ctx, terminateSQL, pid).Scan(&ok); err != nil || !ok {
			return e.fail(fmt.Errorf("end the pause's session (pid %d): %v (ending another role's session needs that role "+
				"or pg_signal_backend)", pid, errOr(err, "pg_terminate_backend returned false")))
		}
	}
	// The server frees the lock as the session exits: wait for it, so that
	// the next relay pass after this command can win.
	for deadline := time.Now().Add(10 * time.Second); ; {
		now, err := e.admin.Election(ctx)
		if err != nil {
			return e.fail(err)
		}
		if h := firstGranted(now); h == nil || h.Kind != relay.HolderPause {
			break
		}
		if time.Now().After(deadline) {
			return e.fail(fmt.Errorf("the pause's session (pid %v) was told to end but still holds the election", pids))
		}
		select {
		case <-ctx.Done():
			return e.fail(ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	was := "a pause that was still waiting for the election"
	if h := firstGranted(holders); h != nil && h.Kind == relay.HolderPause {
		was = "the pause " + diagnose.Holder(*h)
	}
	fprintf(e.stdout, "resumed: ended %s; the relays of app %q deliver again from their next pass\n", was, app)
	return exitOK
}

func firstGranted(hs []relay.LockHolder) *relay.LockHolder {
	for i := range hs {
		if hs[i].Granted {
			return &hs[i]
		}
	}
	return nil
}

// printElectionTo writes the holders to stderr.
func printElectionTo(e *env, hs []relay.LockHolder) {
	for _, h := range hs {
		fprintf(e.stderr, "  %s\n", diagnose.Holder(h))
	}
}

func errOr(err error, s string) any {
	if err != nil {
		return err
	}
	return s
}
