package main

import (
	"bytes"
	"context"
	"slices"
	"testing"
)

// TestTheExampleDelivers runs the example, as `go run .` does: the messages
// of the two orders that committed are delivered, and none of the order
// whose transaction rolled back.
func TestTheExampleDelivers(t *testing.T) {
	var out bytes.Buffer
	delivered, err := run(context.Background(), &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"order order-1", "order order-3", "stock sku-a", "stock sku-a", "stock sku-b"}
	got := slices.Sorted(slices.Values(delivered))
	if !slices.Equal(got, want) {
		t.Fatalf("delivered %q, want %q (in any order)", delivered, want)
	}
	for _, line := range []string{"order-2 refused, rolled back with its messages", "rows left to deliver: 0"} {
		if !bytes.Contains(out.Bytes(), []byte(line)) {
			t.Errorf("the output does not say %q", line)
		}
	}
}
