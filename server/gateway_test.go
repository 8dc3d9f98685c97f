package server_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/fdb-etcd/fdb-etcd/internal/testserver"
	"github.com/fdb-etcd/fdb-etcd/server"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// postJSON posts body to the gateway and decodes the JSON answer.
func postJSON(t *testing.T, c *http.Client, u, body string) (int, map[string]any) {
	t.Helper()
	resp, err := c.Post(u, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", u, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST %s: %d, not JSON: %q", u, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// field walks a decoded JSON document: field(m, "header", "revision").
func field(m any, path ...string) any {
	for _, p := range path {
		mm, ok := m.(map[string]any)
		if !ok {
			return nil
		}
		m = mm[p]
	}
	return m
}

// TestGatewayJSON: etcd's /v3/ JSON gateway on the client port answers
// KV, Lease, Maintenance and Cluster calls with etcd's JSON, errors as
// etcd's gateway encodes them, and etcd's older /v3beta/ prefix.
func TestGatewayJSON(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{})
	c := &http.Client{Timeout: 30 * time.Second}
	code, put := postJSON(t, c, ts.Addr+"/v3/kv/put", `{"key":"`+b64("foo")+`","value":"`+b64("bar")+`"}`)
	if code != 200 || field(put, "header", "revision") != "2" || field(put, "header", "member_id") == nil {
		t.Fatalf("put: %d %v", code, put)
	}
	code, rng := postJSON(t, c, ts.Addr+"/v3beta/kv/range", `{"key":"`+b64("foo")+`"}`)
	kvs, _ := field(rng, "kvs").([]any)
	if code != 200 || len(kvs) != 1 || field(kvs[0], "value") != b64("bar") || field(kvs[0], "mod_revision") != "2" || field(rng, "count") != "1" {
		t.Fatalf("range: %d %v", code, rng)
	}
	code, txn := postJSON(t, c, ts.Addr+"/v3/kv/txn", `{"compare":[{"key":"`+b64("foo")+`","target":"VALUE","value":"`+b64("bar")+`"}],"success":[{"request_delete_range":{"key":"`+b64("foo")+`"}}]}`)
	if code != 200 || field(txn, "succeeded") != true {
		t.Fatalf("txn: %d %v", code, txn)
	}
	code, bad := postJSON(t, c, ts.Addr+"/v3/kv/range", `{"key":"`+b64("foo")+`","revision":"1000"}`)
	if code != 400 || field(bad, "code") != float64(11) || field(bad, "message") != "etcdserver: mvcc: required revision is a future revision" {
		t.Fatalf("future revision: %d %v", code, bad)
	}
	code, grant := postJSON(t, c, ts.Addr+"/v3/lease/grant", `{"TTL":"60","ID":"77"}`)
	if code != 200 || field(grant, "ID") != "77" || field(grant, "TTL") != "60" {
		t.Fatalf("lease grant: %d %v", code, grant)
	}
	code, ttl := postJSON(t, c, ts.Addr+"/v3/lease/timetolive", `{"ID":"77"}`)
	if code != 200 || field(ttl, "grantedTTL") != "60" {
		t.Fatalf("lease timetolive: %d %v", code, ttl)
	}
	code, st := postJSON(t, c, ts.Addr+"/v3/maintenance/status", `{}`)
	if code != 200 || field(st, "version") == nil || field(st, "dbSizeQuota") == nil {
		t.Fatalf("status: %d %v", code, st)
	}
	code, ml := postJSON(t, c, ts.Addr+"/v3/cluster/member/list", `{}`)
	if members, _ := field(ml, "members").([]any); code != 200 || len(members) != 1 {
		t.Fatalf("member list: %d %v", code, ml)
	}
	// The server has no Auth service; the gateway says what gRPC says.
	code, auth := postJSON(t, c, ts.Addr+"/v3/auth/status", `{}`)
	if code != 501 || field(auth, "code") != float64(12) {
		t.Fatalf("auth status: %d %v", code, auth)
	}
}

// TestGatewayWatchStream: /v3/watch streams newline-delimited JSON results
// for the watch requests in the request body. As with etcd, the body is
// read to its end before the answers start (HTTP/1.1 is not full duplex in
// Go's server), and the watch then goes on until the client leaves.
func TestGatewayWatchStream(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := `{"create_request":{"key":"` + b64("w") + `","prev_kv":true}}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ts.Addr+"/v3/watch", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	next := func() map[string]any {
		if !lines.Scan() {
			t.Fatalf("watch stream ended: %v", lines.Err())
		}
		var m map[string]any
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		return m
	}
	if created := next(); field(created, "result", "created") != true {
		t.Fatalf("first line %v, want the creation", created)
	}
	if _, err := ts.Client.Put(ctx, "w", "1"); err != nil {
		t.Fatal(err)
	}
	ev := next()
	events, _ := field(ev, "result", "events").([]any)
	if len(events) != 1 || field(events[0], "kv", "value") != b64("1") {
		t.Fatalf("event line %v", ev)
	}
}

// TestGatewayBehindClientCertificates: on a TLS client port the gateway is
// served behind the same handshake, and can be turned off.
func TestGatewayBehindClientCertificates(t *testing.T) {
	clientURL, metricsURL, good, _ := mtlsServer(t, server.Config{})
	code, rng := postJSON(t, tlsHTTPClient(good), clientURL+"/v3/kv/range", `{"key":"`+b64("k")+`"}`)
	if code != 200 || field(rng, "header", "revision") != "1" {
		t.Fatalf("range over TLS: %d %v", code, rng)
	}
	if code, _ := httpGet(t, &http.Client{Timeout: 30 * time.Second}, metricsURL+"/v3/kv/range"); code != 404 {
		t.Errorf("the metrics listener serves the gateway: %d", code)
	}
	off, _, good2, _ := mtlsServer(t, server.Config{DisableGRPCGateway: true})
	resp, err := tlsHTTPClient(good2).Post(off+"/v3/kv/range", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Errorf("gateway disabled: %d, want 404", resp.StatusCode)
	}
}

// TestClientPortCORS: etcd's client port allows any origin by default.
func TestClientPortCORS(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{})
	req, _ := http.NewRequest(http.MethodOptions, ts.Addr+"/v3/kv/range", nil)
	req.Header.Set("Origin", "http://example.com")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
		resp.Header.Get("Access-Control-Allow-Headers") != "accept, content-type, authorization" {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
}

// TestGatewayWebsocketWatch: as etcd's, the gateway takes websocket
// upgrades, over which a watch stream is full duplex: requests and answers
// are messages, and a request can follow answers.
func TestGatewayWebsocketWatch(t *testing.T) {
	ts := testserver.Start(t, testserver.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, resp, err := websocket.DefaultDialer.DialContext(ctx, "ws"+strings.TrimPrefix(ts.Addr, "http")+"/v3/watch", nil)
	if err != nil {
		t.Fatalf("websocket dial: %v %v", err, resp)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	next := func() map[string]any {
		t.Helper()
		var m map[string]any
		if err := conn.ReadJSON(&m); err != nil {
			t.Fatalf("websocket read: %v", err)
		}
		return m
	}
	send := func(msg string) {
		t.Helper()
		if err := conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"create_request":{"key":"` + b64("a") + `"}}`)
	if m := next(); field(m, "result", "created") != true {
		t.Fatalf("first message %v, want the creation", m)
	}
	if _, err := ts.Client.Put(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	if events, _ := field(next(), "result", "events").([]any); len(events) != 1 || field(events[0], "kv", "value") != b64("1") {
		t.Fatalf("event message %v", events)
	}
	send(`{"create_request":{"key":"` + b64("b") + `","watch_id":"5"}}`)
	if m := next(); field(m, "result", "created") != true || field(m, "result", "watch_id") != "5" {
		t.Fatalf("second creation %v", m)
	}
}
