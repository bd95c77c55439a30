package main

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEchoPrintsTheRequestAndAnswersItsStatus(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	req := httptest.NewRequest(http.MethodPut, "/relay/order/order-1", strings.NewReader(`{"id": "order-1"}`))
	req.Header.Set("Relay-Message-Key", "order-1")
	req.Header.Set("Relay-Message-Id", "42")
	req.Header.Set("Authorization", "Bearer not printed")
	rec := httptest.NewRecorder()
	echo(&out, http.StatusServiceUnavailable).ServeHTTP(rec, req)

	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	require.Equal(t, "PUT /relay/order/order-1\n"+
		"  Relay-Message-Key: order-1\n"+
		"  Relay-Message-Id: 42\n"+
		"  {\"id\": \"order-1\"}\n"+
		"-> 503 Service Unavailable\n", out.String())
}
