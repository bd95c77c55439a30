package session

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/store"
)

// Timings of a session's advisory locks (the elections', presence's). An
// unlock runs under its own short deadline, never under a caller's context
// that may already be cancelled.
const (
	LockTimeout   = 30 * time.Second
	UnlockTimeout = 5 * time.Second
)

// guardSessionEndTimeout bounds WaitLockGone.
const guardSessionEndTimeout = 2 * time.Second

// WaitLockGone returns once pg_locks shows no advisory lock of backend pid, whose
// connection was just closed: the server drops a session's locks as its
// backend exits, a moment after the client has gone.
func WaitLockGone(ctx context.Context, pool *pgxpool.Pool, pid uint32) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guardSessionEndTimeout)
	defer cancel()
	for {
		held, err := store.SessionLocksHeld(wctx, pool, pid)
		switch {
		case err != nil:
			return err
		case !held:
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("backend %d still holds advisory locks after %s", pid, guardSessionEndTimeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
