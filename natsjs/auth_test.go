package natsjs_test

import (
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/testlog"
	"github.com/xadm/relay/natsjs"
)

// TestConnectNkey: the sender authenticates with the options nats.go takes
// (an nkey here; credentials files and TLS likewise), against a server that
// admits nobody else (docs/security.md).
func TestConnectNkey(t *testing.T) {
	t.Parallel()
	kp, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := kp.PublicKey()
	require.NoError(t, err)
	n := startNATS(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	createStream(t, n.jetStream(t, nats.Nkey(pub, kp.Sign)), jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"relay.>"}})

	s, err := natsjs.Connect(n.URL(), natsjs.Config{Type: "order", Logger: (&testlog.Buffer{}).Logger()}, nats.Nkey(pub, kp.Sign))
	require.NoError(t, err)
	defer s.Close()
	require.NoError(t, s.Send(t.Context(), relay.Message{ID: 1, Type: "order", Key: "k", Payload: []byte(`{}`)}))

	// Without the nkey the server refuses the connection.
	_, err = nats.Connect(n.URL(), nats.MaxReconnects(0))
	require.ErrorContains(t, err, "Authorization Violation")
}

// TestConnectRedactsURL: an error of Connect names the server's URL without
// its password.
func TestConnectRedactsURL(t *testing.T) {
	t.Parallel()
	_, err := natsjs.Connect("nats://relay:planted-nats-password@127.0.0.1:1", natsjs.Config{Type: "order"},
		nats.UserCredentials("/nonexistent/relay.creds"))
	require.Error(t, err)
	require.NotContains(t, err.Error(), "planted-nats-password")
	require.Contains(t, err.Error(), "nats://relay:xxxxx@127.0.0.1:1")
}
