package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// One command gives a console that serves the relay's table: the front page
// shows both types, and the dead invoices (every third one is refused) appear
// on the dead page once the relay has tried them.
func TestTheExampleServesTheConsole(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	urls := make(chan string, 1)
	done := make(chan error, 1)
	var out strings.Builder
	go func() { done <- run(ctx, "127.0.0.1:0", "relay_console_example", &out, func(u string) { urls <- u }) }()

	var url string
	select {
	case url = <-urls:
	case err := <-done:
		t.Fatalf("run returned before serving: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "The console: "+url) {
		t.Errorf("the URL is not printed:\n%s", out.String())
	}
	front := get(t, url)
	for _, want := range []string{"order", "invoice"} {
		if !strings.Contains(front, want) {
			t.Errorf("the front page does not show %q:\n%s", want, front)
		}
	}
	// The relay runs in the background: wait until it has marked a dead row.
	for !strings.Contains(get(t, url+"dead"), "422 Unprocessable Entity") {
		select {
		case err := <-done:
			t.Fatalf("run returned: %v", err)
		case <-time.After(100 * time.Millisecond): // polling a condition, not waiting a duration
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after Ctrl-C: %v", err)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s\n%s", url, resp.Status, b)
	}
	return string(b)
}
