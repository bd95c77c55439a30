package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// TLS is the certificate a local cluster started with [Options.TLS] serves.
type TLS struct {
	// CertPEM and KeyPEM are the server's certificate and key; its names must
	// include 127.0.0.1, the host of the server's URL.
	CertPEM, KeyPEM []byte
	// CAPEM is the CA the server's URL trusts (sslrootcert).
	CAPEM []byte
}

// The TLS files in a cluster's directory.
const (
	tlsCertFile = "server.crt"
	tlsKeyFile  = "server.key"
	tlsCAFile   = "root.crt"
)

// hbaTLS is the pg_hba.conf of a cluster started with TLS: TCP connections
// only over TLS (a client with sslmode=disable is refused), the socket as
// initdb leaves it.
const hbaTLS = `local   all all                trust
hostssl all all 127.0.0.1/32   trust
hostssl all all ::1/128        trust
`

// setupTLS writes t's files into the cluster, TCP over TLS only in its
// pg_hba.conf, and the settings that serve them.
func (c *cluster) setupTLS(t *TLS) error {
	if len(t.CertPEM) == 0 || len(t.KeyPEM) == 0 || len(t.CAPEM) == 0 {
		return errors.New("pgserver: Options.TLS needs CertPEM, KeyPEM and CAPEM")
	}
	if err := c.writeTLS(t.CertPEM, t.KeyPEM); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(c.dir, tlsCAFile), string(t.CAPEM), c.user); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(c.dataDir(), "pg_hba.conf"), hbaTLS, c.user); err != nil {
		return err
	}
	c.tls = true
	c.settings = append(c.settings, "ssl=on",
		"ssl_cert_file="+filepath.Join(c.dir, tlsCertFile), "ssl_key_file="+filepath.Join(c.dir, tlsKeyFile))
	return nil
}

// writeTLS writes the server's certificate and key (readable by the server's
// user alone, as PostgreSQL requires of the key).
func (c *cluster) writeTLS(certPEM, keyPEM []byte) error {
	if err := writeFile(filepath.Join(c.dir, tlsCertFile), string(certPEM), c.user); err != nil {
		return err
	}
	return writeFile(filepath.Join(c.dir, tlsKeyFile), string(keyPEM), c.user)
}

// url is the URL of database db as user on the cluster: verify-full against
// its CA with TLS, no TLS without.
func (c *cluster) url(user, db string) string {
	if !c.tls {
		return pgURL(user, c.port, db)
	}
	q := url.Values{"sslmode": {"verify-full"}, "sslrootcert": {filepath.Join(c.dir, tlsCAFile)}}
	u := url.URL{Scheme: "postgres", User: url.User(user), Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(c.port)), Path: "/" + db, RawQuery: q.Encode()}
	return u.String()
}

// StartLocal starts a fresh local cluster with opt, whatever the environment
// says: for the tests that need a server of their own (TLS, a role's
// authentication). It fails when there are no local binaries.
func StartLocal(ctx context.Context, opt Options) (*Server, error) {
	binDir := findBinDir(ctx)
	if binDir == "" {
		return nil, errors.New("pgserver: no local PostgreSQL binaries (Debian: apt-get install -y postgresql; or set PG_BIN)")
	}
	return startLocalWith(ctx, binDir, opt)
}

// RotateTLS replaces the certificate of a local cluster started with TLS and
// has the server reload it, as an operator's rotation does: connections made
// after it are served the new certificate, those open keep theirs.
func (s *Server) RotateTLS(ctx context.Context, certPEM, keyPEM []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.controllable(); err != nil {
		return err
	}
	if !s.local.tls {
		return errors.New("pgserver: RotateTLS: the server was started without TLS")
	}
	if err := s.local.writeTLS(certPEM, keyPEM); err != nil {
		return err
	}
	return s.local.reload(ctx)
}

// reload has the server reload its configuration and certificate files.
func (c *cluster) reload(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.url("postgres", "postgres"))
	if err != nil {
		return fmt.Errorf("pgserver: reload: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgserver: reload: %w", err)
	}
	return nil
}
