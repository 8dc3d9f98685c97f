package etcdcompat

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

// The JSON gateway on the client port (/v3/*), compared answer by answer:
// HTTP status, Content-Type, the CORS headers and the JSON body with its
// header reduced to the revision (cluster_id, member_id and raft_term
// legitimately differ).

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// gwAnswer is one gateway answer in canonical form.
type gwAnswer struct {
	status  int
	headers string
	body    any // decoded JSON, normalized
	raw     string
}

func (a gwAnswer) String() string {
	b, _ := json.Marshal(a.body)
	return fmt.Sprintf("%d %s %s", a.status, a.headers, b)
}

func (s *server) gw(t *testing.T, method, path, body string) gwAnswer {
	t.Helper()
	req, err := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.http.Do(req)
	if err != nil {
		t.Fatalf("%s %s %s: %v", s.name, method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return answer(resp, raw)
}

func answer(resp *http.Response, raw []byte) gwAnswer {
	var hs []string
	for _, h := range []string{"Content-Type", "Access-Control-Allow-Origin", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers"} {
		hs = append(hs, h+"="+resp.Header.Get(h))
	}
	a := gwAnswer{status: resp.StatusCode, headers: strings.Join(hs, ";"), raw: string(raw)}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		a.body = "NOT JSON: " + string(raw)
		return a
	}
	a.body = normalize(v)
	return a
}

// normalize drops the identity fields of every "header" object, and
// turns the non-breaking spaces protobuf-go puts at random into its error
// messages (different in every binary, so that nobody parses them) into
// spaces.
func normalize(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if m, ok := e.(string); ok && k == "message" {
				e = strings.ReplaceAll(m, "\u00a0", " ")
			}
			if k == "header" {
				if h, ok := e.(map[string]any); ok {
					delete(h, "cluster_id")
					delete(h, "member_id")
					delete(h, "raft_term")
				}
			}
			x[k] = normalize(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normalize(e)
		}
	}
	return v
}

// gwCheck sends the same request to both gateways and compares.
func (p *pair) gwCheck(t *testing.T, method, path, body string) gwAnswer {
	t.Helper()
	ref := p.ref.gw(t, method, path, body)
	cand := p.cand.gw(t, method, path, body)
	if ref.String() != cand.String() {
		t.Errorf("MISMATCH %s %s %s\n  etcd:     %s\n  %-9s %s", method, path, body, ref, p.cand.name+":", cand)
	}
	return ref
}

// TestGatewayCompat: KV, Lease, Maintenance and Cluster calls through the
// JSON gateway, including errors, bad JSON, unknown paths, etcd's /v3beta/
// prefix and the CORS preflight.
func TestGatewayCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	post := func(path, body string) gwAnswer { t.Helper(); return p.gwCheck(t, http.MethodPost, path, body) }
	k := func(s string) string { return `"` + b64(s) + `"` }
	post("/v3/kv/put", `{"key":`+k("a/1")+`,"value":`+k("v1")+`}`)
	post("/v3/kv/put", `{"key":`+k("a/2")+`,"value":`+k("v2")+`,"prev_kv":true}`)
	post("/v3/kv/put", `{"key":`+k("a/2")+`,"value":`+k("v3")+`,"prev_kv":true}`)
	post("/v3/kv/range", `{"key":`+k("a/1")+`}`)
	post("/v3/kv/range", `{"key":`+k("a/")+`,"range_end":`+k("a0")+`,"limit":1,"sort_order":"DESCEND","sort_target":"MOD"}`)
	post("/v3/kv/range", `{"key":`+k("a/")+`,"range_end":`+k("a0")+`,"count_only":true}`)
	post("/v3/kv/range", `{"key":`+k("a/")+`,"range_end":`+k("a0")+`,"keys_only":true,"revision":"3"}`)
	post("/v3beta/kv/range", `{"key":`+k("a/2")+`}`)
	post("/v3/kv/txn", `{"compare":[{"key":`+k("a/1")+`,"target":"VALUE","value":`+k("v1")+`}],`+
		`"success":[{"request_put":{"key":`+k("a/3")+`,"value":`+k("v4")+`}},{"request_range":{"key":`+k("a/")+`,"range_end":`+k("a0")+`}}],`+
		`"failure":[{"request_delete_range":{"key":`+k("a/1")+`}}]}`)
	post("/v3/kv/txn", `{"compare":[{"key":`+k("a/1")+`,"target":"VERSION","result":"GREATER","version":"5"}],`+
		`"failure":[{"request_txn":{"success":[{"request_range":{"key":`+k("a/3")+`}}]}}]}`)
	post("/v3/kv/deleterange", `{"key":`+k("a/3")+`,"prev_kv":true}`)
	post("/v3/kv/deleterange", `{"key":`+k("nothing")+`}`)
	post("/v3/kv/range", `{"key":`+k("a/1")+`,"revision":"1000"}`)
	post("/v3/kv/put", `{"key":"","value":`+k("v")+`}`)
	post("/v3/kv/compaction", `{"revision":"3"}`)
	post("/v3/kv/range", `{"key":`+k("a/1")+`,"revision":"2"}`)
	post("/v3/kv/compaction", `{"revision":"2"}`)

	post("/v3/lease/grant", `{"ID":"100","TTL":"60"}`)
	post("/v3/lease/grant", `{"ID":"100","TTL":"60"}`)
	post("/v3/kv/put", `{"key":`+k("l/1")+`,"value":`+k("v")+`,"lease":"100"}`)
	post("/v3/kv/put", `{"key":`+k("l/2")+`,"value":`+k("v")+`,"lease":"101"}`)
	checkTimeToLive(t, p, `{"ID":"100","keys":true}`)
	post("/v3/lease/leases", `{}`)
	post("/v3/kv/lease/leases", `{}`)
	post("/v3/lease/revoke", `{"ID":"100"}`)
	post("/v3/lease/timetolive", `{"ID":"100"}`)
	post("/v3/kv/lease/revoke", `{"ID":"100"}`)
	post("/v3/kv/range", `{"key":`+k("l/")+`,"range_end":`+k("l0")+`}`)

	post("/v3/maintenance/alarm", `{"action":"GET"}`)
	post("/v3/maintenance/hashkv", `{"revision":"4"}`)
	post("/v3/kv/range", `not json`)
	post("/v3/kv/range", `{"key":5}`)
	post("/v3/kv/nonsense", `{}`)
	p.gwCheck(t, http.MethodGet, "/v3/kv/range", "")
	p.gwCheck(t, http.MethodOptions, "/v3/kv/range", "")
	checkGatewayStatus(t, p)
	checkGatewayMembers(t, p)
}

// checkTimeToLive compares a TimeToLive whose remaining TTL may differ by
// ttlSlack seconds.
func checkTimeToLive(t *testing.T, p *pair, body string) {
	t.Helper()
	ref := p.ref.gw(t, http.MethodPost, "/v3/lease/timetolive", body)
	cand := p.cand.gw(t, http.MethodPost, "/v3/lease/timetolive", body)
	ttl := func(a gwAnswer) int {
		var n int
		m, _ := a.body.(map[string]any)
		fmt.Sscan(fmt.Sprint(m["TTL"]), &n)
		delete(m, "TTL")
		return n
	}
	rt, ct := ttl(ref), ttl(cand)
	if ref.String() != cand.String() || rt-ct > ttlSlack || ct-rt > ttlSlack {
		t.Errorf("MISMATCH timetolive %s\n  etcd:     TTL=%d %s\n  %-9s TTL=%d %s", body, rt, ref, p.cand.name+":", ct, cand)
	}
}

// checkGatewayStatus compares the Status fields that do not describe the
// member itself (sizes, raft indexes and ids do), and which fields are
// present. etcd moves storageVersion from 3.5.0 to 3.6.0 some time after
// start, so its value is not compared.
func checkGatewayStatus(t *testing.T, p *pair) {
	t.Helper()
	pick := func(a gwAnswer) string {
		m, _ := a.body.(map[string]any)
		keep := map[string]any{"status": a.status, "headers": a.headers}
		for _, f := range []string{"header", "version", "dbSizeQuota", "raftTerm", "errors", "isLearner", "downgradeInfo"} {
			keep[f] = m[f]
		}
		var fields []string
		for f := range m {
			fields = append(fields, f)
		}
		sort.Strings(fields)
		keep["fields"] = fields
		b, _ := json.Marshal(keep)
		return string(b)
	}
	ref := pick(p.ref.gw(t, http.MethodPost, "/v3/maintenance/status", `{}`))
	cand := pick(p.cand.gw(t, http.MethodPost, "/v3/maintenance/status", `{}`))
	if ref != cand {
		t.Errorf("MISMATCH status\n  etcd:     %s\n  %-9s %s", ref, p.cand.name+":", cand)
	}
}

// checkGatewayMembers: one member named by --name, with the advertised
// client URL. Peer URLs are left out: fdb-etcd's members have none.
func checkGatewayMembers(t *testing.T, p *pair) {
	t.Helper()
	pick := func(s *server) string {
		a := s.gw(t, http.MethodPost, "/v3/cluster/member/list", `{"linearizable":true}`)
		m, _ := a.body.(map[string]any)
		members, _ := m["members"].([]any)
		var out []string
		for _, x := range members {
			mm, _ := x.(map[string]any)
			urls := fmt.Sprint(mm["clientURLs"])
			out = append(out, fmt.Sprintf("name=%v clientURLs=%s own=%t learner=%v id=%t", mm["name"], urls, urls == "["+s.url+"]", mm["isLearner"], mm["ID"] != nil))
		}
		return fmt.Sprintf("%d %s header=%v %v", a.status, a.headers, m["header"], out)
	}
	if ref, cand := pick(p.ref), pick(p.cand); ref != strings.ReplaceAll(cand, p.cand.url, p.ref.url) {
		t.Errorf("MISMATCH member list\n  etcd:     %s\n  %-9s %s", ref, p.cand.name+":", cand)
	}
}

// TestGatewayWatchCompat: /v3/watch streams one JSON object per line. The
// request body (two watches: one replaying history, one from now on) is sent
// whole, as curl sends it; events written afterwards arrive on the stream.
// As in TestWatchCompat, how events are batched into responses depends on
// timing, so events are compared per watch, flattened, and the other
// responses (creation) in full.
func TestGatewayWatchCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	for i := range 3 {
		p.check(t, "setup", &pb.PutRequest{Key: []byte(fmt.Sprintf("w/%d", i)), Value: []byte("v")})
	}
	body := `{"create_request":{"key":"` + b64("w/") + `","range_end":"` + b64("w0") + `","start_revision":"2","prev_kv":true}}` + "\n" +
		`{"create_request":{"key":"` + b64("w/1") + `","watch_id":"7"}}`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ref, cand := p.ref.watchStream(ctx, t, body), p.cand.watchStream(ctx, t, body)
	// Both creations and the replay of revisions 2..4 to watch 0.
	want := map[string]int{"0": 3}
	ref.collect(t, 2, want)
	cand.collect(t, 2, want)
	// Revision 5 for both watches, 6 for watch 0.
	p.check(t, "live put", &pb.PutRequest{Key: []byte("w/1"), Value: []byte("live")})
	p.check(t, "live delete", &pb.DeleteRangeRequest{Key: []byte("w/0")})
	want = map[string]int{"0": 5, "7": 1}
	ref.collect(t, 2, want)
	cand.collect(t, 2, want)
	if r, c := ref.transcript(), cand.transcript(); r != c {
		t.Errorf("MISMATCH watch transcript\n  etcd:\n%s\n  %s:\n%s", r, p.cand.name, c)
	}
}

// TestGatewayWebsocketCompat: the gateway takes websocket upgrades as
// etcd's does; over one, a watch stream is full duplex: a create request can
// follow events.
func TestGatewayWebsocketCompat(t *testing.T) {
	t.Parallel()
	p := startPair(t)
	p.check(t, "setup", &pb.PutRequest{Key: []byte("ws/0"), Value: []byte("v")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ref, cand := p.ref.websocketWatch(ctx, t), p.cand.websocketWatch(ctx, t)
	both := func(msg string) { ref.send(t, msg); cand.send(t, msg) }
	both(`{"create_request":{"key":"` + b64("ws/") + `","range_end":"` + b64("ws0") + `","prev_kv":true}}`)
	ref.collect(t, 1, nil)
	cand.collect(t, 1, nil)
	p.check(t, "put", &pb.PutRequest{Key: []byte("ws/0"), Value: []byte("w")})
	ref.collect(t, 1, map[string]int{"0": 1})
	cand.collect(t, 1, map[string]int{"0": 1})
	both(`{"create_request":{"key":"` + b64("ws/1") + `","watch_id":"9"}}`)
	ref.collect(t, 2, nil)
	cand.collect(t, 2, nil)
	p.check(t, "put", &pb.PutRequest{Key: []byte("ws/1"), Value: []byte("x")})
	ref.collect(t, 2, map[string]int{"0": 2, "9": 1})
	cand.collect(t, 2, map[string]int{"0": 2, "9": 1})
	both(`{"cancel_request":{"watch_id":"9"}}`)
	ref.collect(t, 3, nil)
	cand.collect(t, 3, nil)
	if r, c := ref.transcript(), cand.transcript(); r != c {
		t.Errorf("MISMATCH websocket watch transcript\n  etcd:\n%s\n  %s:\n%s", r, p.cand.name, c)
	}
}

// websocketWatch opens /v3/watch as a websocket; each message is one line.
func (s *server) websocketWatch(ctx context.Context, t *testing.T) *lineStream {
	t.Helper()
	dialer, scheme := *websocket.DefaultDialer, "ws"
	if s.tls != nil {
		dialer.TLSClientConfig, scheme = s.tls, "wss"
	}
	conn, resp, err := dialer.DialContext(ctx, scheme+"://"+s.endpoint+"/v3/watch", nil)
	if err != nil {
		t.Fatalf("%s websocket: %v %v", s.name, err, resp)
	}
	l := newLineStream(s.name)
	l.conn = conn
	done := make(chan struct{})
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
	go func() {
		defer close(done)
		defer close(l.lines)
		for {
			_, msg, err := conn.ReadMessage()
			if err != nil {
				return
			}
			l.lines <- string(bytes.TrimSpace(msg))
		}
	}()
	return l
}

func (l *lineStream) send(t *testing.T, msg string) {
	t.Helper()
	if err := l.conn.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
		t.Fatalf("%s websocket send: %v", l.name, err)
	}
}

// lineStream is one /v3/watch response body, read line by line, or one
// websocket, read message by message.
type lineStream struct {
	name     string
	conn     *websocket.Conn // for a websocket
	lines    chan string
	controls map[string][]string // by watch id: responses without events
	events   map[string][]string // by watch id: events, flattened
}

func (s *server) watchStream(ctx context.Context, t *testing.T, body string) *lineStream {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v3/watch", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	// s.http's transport without its timeout: the stream lasts the test.
	resp, err := (&http.Client{Transport: s.http.Transport}).Do(req)
	if err != nil {
		t.Fatalf("%s watch: %v", s.name, err)
	}
	l := newLineStream(s.name)
	done := make(chan struct{})
	t.Cleanup(func() {
		resp.Body.Close()
		<-done
	})
	go func() {
		defer close(done)
		defer close(l.lines)
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 4<<20)
		for sc.Scan() {
			l.lines <- string(bytes.TrimSpace(sc.Bytes()))
		}
	}()
	return l
}

func newLineStream(name string) *lineStream {
	return &lineStream{name: name, lines: make(chan string, 64), controls: map[string][]string{}, events: map[string][]string{}}
}

// collect reads lines until there are controls responses without events
// and, per watch id, the wanted number of events.
func (l *lineStream) collect(t *testing.T, controls int, events map[string]int) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for !l.has(controls, events) {
		select {
		case line, ok := <-l.lines:
			if !ok {
				t.Fatalf("%s watch stream ended: %s", l.name, l.transcript())
			}
			l.add(line)
		case <-timeout:
			t.Fatalf("%s watch stream: still waiting for %d responses and events %v; have:\n%s", l.name, controls, events, l.transcript())
		}
	}
}

func (l *lineStream) has(controls int, events map[string]int) bool {
	n := 0
	for _, c := range l.controls {
		n += len(c)
	}
	for id, want := range events {
		if len(l.events[id]) < want {
			return false
		}
	}
	return n >= controls
}

func (l *lineStream) add(line string) {
	var v struct {
		Result map[string]any `json:"result"`
	}
	if err := json.Unmarshal([]byte(line), &v); err != nil || v.Result == nil {
		l.controls["?"] = append(l.controls["?"], line)
		return
	}
	id := fmt.Sprint(v.Result["watch_id"])
	if id == "<nil>" {
		id = "0"
	}
	evs, _ := v.Result["events"].([]any)
	if len(evs) == 0 {
		b, _ := json.Marshal(normalize(v.Result))
		l.controls[id] = append(l.controls[id], string(b))
		return
	}
	for _, e := range evs {
		b, _ := json.Marshal(e)
		l.events[id] = append(l.events[id], string(b))
	}
}

func (l *lineStream) transcript() string {
	var ids []string
	for id := range l.controls {
		ids = append(ids, id)
	}
	for id := range l.events {
		if _, ok := l.controls[id]; !ok {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	var b strings.Builder
	for _, id := range ids {
		fmt.Fprintf(&b, "    watch %s: %v\n", id, l.controls[id])
		for _, e := range l.events[id] {
			fmt.Fprintf(&b, "      %s\n", e)
		}
	}
	return b.String()
}
