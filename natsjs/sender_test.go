package natsjs_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xadm/relay/internal/testkit/testlog"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/natsjs"
)

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	js := startNATS(t).jetStream(t)
	for _, tt := range []struct {
		name string
		cfg  natsjs.Config
		want string
	}{
		{"EmptyType", natsjs.Config{}, "natsjs: Config.Type must not be empty"},
		{"BlankType", natsjs.Config{Type: "  "}, "natsjs: Config.Type must not be empty"},
		{"TypeWithNewline", natsjs.Config{Type: "a\nb"}, "natsjs: Config.Type"},
		{"PrefixWithSpace", natsjs.Config{Type: "order", SubjectPrefix: "re lay"}, "natsjs: Config.SubjectPrefix"},
		{"PrefixWithEmptyToken", natsjs.Config{Type: "order", SubjectPrefix: "relay."}, "natsjs: Config.SubjectPrefix"},
		{"PrefixWithWildcard", natsjs.Config{Type: "order", SubjectPrefix: "relay.*"}, "natsjs: Config.SubjectPrefix"},
		{"PrefixWithGreaterThan", natsjs.Config{Type: "order", SubjectPrefix: "a>b"}, "natsjs: Config.SubjectPrefix"},
		{"StreamWithDot", natsjs.Config{Type: "order", Stream: "OR.DERS"}, "natsjs: Config.Stream"},
		{"StreamWithSlash", natsjs.Config{Type: "order", Stream: "a/b"}, "natsjs: Config.Stream"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := natsjs.New(js, tt.cfg)
			require.ErrorContains(t, err, tt.want)
			_, err = natsjs.Connect("nats://127.0.0.1:1", tt.cfg)
			require.ErrorContains(t, err, tt.want)
		})
	}
	_, err := natsjs.New(nil, natsjs.Config{Type: "order"})
	require.ErrorContains(t, err, "natsjs: New needs a jetstream.JetStream")

	s, err := natsjs.New(js, natsjs.Config{Type: "order", SubjectPrefix: "acme.relay", Stream: "ORDERS"})
	require.NoError(t, err)
	require.Equal(t, "order", s.Type())
	s.Close() // the caller's connection stays open
	require.True(t, js.Conn().IsConnected())
}

// message is a hand-built relay message: its idempotency key is its id.
func message(id int64, typ, key string, payload string) relay.Message {
	return relay.Message{ID: id, Type: typ, Key: key, Payload: []byte(payload), CreatedAt: time.Now()}
}

func TestSendBatchPublishesEveryMessageAndFailsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	n := startNATS(t, func(o *server.Options) { o.MaxPayload = 64 << 10 })
	js := n.jetStream(t)
	createStream(t, js, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"}})
	s, err := natsjs.New(js, natsjs.Config{Type: "order"})
	require.NoError(t, err)

	const total, tooLarge = 200, 117
	ms := make([]relay.Message, total)
	for i := range ms {
		payload := fmt.Sprintf(`{"n": %d}`, i)
		if i == tooLarge {
			payload = `{"blob": "` + strings.Repeat("x", 70<<10) + `"}`
		}
		ms[i] = message(int64(1000+i), "order", "key-"+strconv.Itoa(i), payload)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errs := s.SendBatch(ctx, ms)
	require.Len(t, errs, total)
	for i, err := range errs {
		if i == tooLarge {
			require.True(t, relay.IsPermanent(err), "the too-large message: %v", err)
			require.ErrorContains(t, err, "max_payload")
			continue
		}
		require.NoError(t, err, "message %d", i)
	}

	got := consume(t, js, "RELAY")
	require.Len(t, got, total-1)
	next := 0
	for _, m := range got {
		if next == tooLarge {
			next++
		}
		want := ms[next]
		require.Equal(t, "relay.order.key-"+strconv.Itoa(next), m.Subject)
		require.Equal(t, strconv.FormatInt(want.ID, 10), m.Header.Get(jetstream.MsgIDHeader))
		require.Equal(t, strconv.FormatInt(want.ID, 10), m.Header.Get(natsjs.HeaderMessageID))
		require.Equal(t, "order", m.Header.Get(natsjs.HeaderMessageType))
		require.Equal(t, want.Key, m.Header.Get(natsjs.HeaderMessageKey))
		require.Equal(t, "1", m.Header.Get(natsjs.HeaderAttempt))
		require.Equal(t, want.Payload, m.Data)
		next++
	}

	// The same batch again, as after a crash before the outcomes were
	// recorded: every message is acknowledged, the stream stores no copy.
	ms[tooLarge] = message(int64(1000+tooLarge), "order", "key-"+strconv.Itoa(tooLarge), `{"small": true}`)
	for i, err := range s.SendBatch(ctx, ms) {
		require.NoError(t, err, "message %d sent again", i)
	}
	require.Len(t, consume(t, js, "RELAY"), total, "the re-sent messages were discarded, the once too large one stored")

	require.Empty(t, s.SendBatch(ctx, nil))
}

func TestSendBatchOnAServerThatIsDownFailsRetryably(t *testing.T) {
	t.Parallel()
	n := startNATS(t)
	js := n.jetStream(t)
	createStream(t, js, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"}})
	logs := &testlog.Buffer{}
	s, err := natsjs.Connect(n.URL(), natsjs.Config{Type: "order", Logger: testLogger(logs)}, nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(s.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, s.Send(ctx, message(1, "order", "a", `{}`)))

	n.stop()
	eventually(t, "the disconnection to be logged", func() bool {
		return strings.Contains(logs.String(), "natsjs: disconnected from NATS")
	})
	errs := s.SendBatch(ctx, []relay.Message{message(2, "order", "a", `{}`), message(3, "order", "b", `{}`)})
	for _, err := range errs {
		require.Error(t, err)
		require.False(t, relay.IsPermanent(err), "%v", err)
		require.ErrorContains(t, err, "the NATS connection is reconnecting")
	}

	n.start()
	eventually(t, "a send to succeed after the server came back", func() bool {
		return s.Send(ctx, message(2, "order", "a", `{}`)) == nil
	})
	require.Contains(t, logs.String(), "natsjs: reconnected to NATS")
}

// TestErrorClassification sends one message per case and checks whether the
// error says retrying can help.
func TestErrorClassification(t *testing.T) {
	t.Parallel()
	n := startNATS(t, func(o *server.Options) {
		o.MaxPayload = 64 << 10
		o.Users = []*server.User{{
			Username: "relay", Password: "secret",
			Permissions: &server.Permissions{Publish: &server.SubjectPermission{Deny: []string{"relay.denied.>"}}},
		}}
	})
	js := n.jetStream(t, nats.UserInfo("relay", "secret"))
	createStream(t, js, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"}})
	createStream(t, js, jetstream.StreamConfig{Name: "SMALL", Subjects: []string{"small.>"}, MaxMsgSize: 512})
	createStream(t, js, jetstream.StreamConfig{Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew})

	big := `{"blob": "` + strings.Repeat("x", 70<<10) + `"}`
	id := int64(100) // one id per case: a stream discards a repeated Nats-Msg-Id
	for _, tt := range []struct {
		name      string
		cfg       natsjs.Config
		payload   string
		permanent bool
		want      string
	}{
		{"Stored", natsjs.Config{Type: "order"}, `{}`, false, ""},
		{"AboveServerMaxPayload", natsjs.Config{Type: "order"}, big, true, "max_payload"},
		{"AboveStreamMaxMsgSize", natsjs.Config{Type: "order", SubjectPrefix: "small"}, `{"blob": "` + strings.Repeat("x", 600) + `"}`, true, "the stream refuses the size"},
		{"NoStreamForTheSubject", natsjs.Config{Type: "order", SubjectPrefix: "nostream"}, `{}`, true, "no JetStream stream is bound to the subject"},
		{"PublishPermissionDenied", natsjs.Config{Type: "denied"}, `{}`, true, "Permissions Violation for Publish"},
		{"BoundToAnotherStream", natsjs.Config{Type: "order", Stream: "SMALL"}, `{}`, true, "another stream than Config.Stream"},
		{"CustomSubjectWithWildcard", natsjs.Config{Type: "order", Subject: func(relay.Message) string { return "relay.*" }}, `{}`, true, "wildcard"},
		{"CustomSubjectPanics", natsjs.Config{Type: "order", Subject: func(relay.Message) string { panic("boom") }}, `{}`, true, "Config.Subject panicked"},
		{"StreamFullWithDiscardNew", natsjs.Config{Type: "order", SubjectPrefix: "full"}, `{}`, false, "maximum messages exceeded"},
	} {
		id++
		t.Run(tt.name, func(t *testing.T) {
			s, err := natsjs.New(js, tt.cfg)
			require.NoError(t, err)
			// A long deadline: a denial must come back through the error
			// handler, not by waiting for the deadline.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if tt.name == "StreamFullWithDiscardNew" {
				require.NoError(t, s.Send(ctx, message(1, "order", "first", `{}`)))
			}
			start := time.Now()
			err = s.Send(ctx, message(id, tt.cfg.Type, "k", tt.payload))
			if tt.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.want)
			require.Equal(t, tt.permanent, relay.IsPermanent(err), "permanent? %v", err)
			require.Less(t, time.Since(start), 50*time.Second, "the error came only at the deadline")
		})
	}
}

func TestSendHonoursAnEndedContext(t *testing.T) {
	t.Parallel()
	n := startNATS(t)
	js := n.jetStream(t)
	createStream(t, js, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"}})
	s, err := natsjs.New(js, natsjs.Config{Type: "order"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = s.Send(ctx, message(1, "order", "a", `{}`))
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, relay.IsPermanent(err))
}

func TestConnectWhileTheServerIsDownThenClose(t *testing.T) {
	t.Parallel()
	n := startNATS(t)
	n.stop()
	s, err := natsjs.Connect(n.URL(), natsjs.Config{Type: "order", Logger: testLogger(&testlog.Buffer{})}, nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err, "a service starts while NATS is down")
	t.Cleanup(s.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = s.Send(ctx, message(1, "order", "a", `{}`))
	require.ErrorContains(t, err, "the server is down or unreachable")
	require.False(t, relay.IsPermanent(err))

	n.start()
	createStream(t, n.jetStream(t), jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"}})
	eventually(t, "a send to succeed once the server is up", func() bool {
		return s.Send(ctx, message(1, "order", "a", `{}`)) == nil
	})

	s.Close()
	err = s.Send(ctx, message(2, "order", "a", `{}`))
	require.ErrorContains(t, err, "the NATS connection is closed")
	require.False(t, relay.IsPermanent(err))
}
