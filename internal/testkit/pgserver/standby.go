package pgserver

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
)

// StartStandby starts a hot standby of the local server s: a base backup
// streamed from it into a fresh directory, started read-only on a free port,
// replicating from s. A relay pointed at it meets what a stale DNS name meets
// after a failover. Stop removes it. It returns an error for other Kinds.
func (s *Server) StartStandby(ctx context.Context) (*Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.controllable(); err != nil {
		return nil, err
	}
	primary := s.local
	dir, err := tempDir("pgserver-", primary.user)
	if err != nil {
		return nil, err
	}
	c := &cluster{binDir: primary.binDir, dir: dir, user: primary.user, settings: primary.settings}
	logFile, offset, err := openLog(c.logPath())
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	args := []string{"-D", c.dataDir(), "-R", "-X", "stream", "-h", "127.0.0.1", "-p", strconv.Itoa(primary.port), "-U", "postgres", "--no-sync"}
	err = command(ctx, filepath.Join(c.binDir, "pg_basebackup"+exe), args, dir, logFile, c.user).Run()
	logFile.Close()
	if err != nil {
		os.RemoveAll(dir)
		return nil, startErr("pg_basebackup", err, c.logPath(), offset)
	}
	// The backup carries the primary's postmaster.opts and port settings in
	// its command line only: start picks its own port and socket directory.
	if err := onFreePort(func(port int) error {
		c.port = port
		return c.start(ctx)
	}); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Server{URL: pgURL("postgres", c.port, "postgres"), Kind: "local", local: c}, nil
}
