package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

func cryptoRand(b []byte) (int, error) { return rand.Read(b) }

type healthBody struct {
	Health string `json:"health"`
	Reason string `json:"reason"`
}

// handleHealth adds etcd's /health and the Kubernetes-style /livez and
// /readyz to mux; the client port and the metrics listeners serve them
// alike.
func (s *Server) handleHealth(mux *http.ServeMux) {
	mux.HandleFunc("/health", s.serveHealth)
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := s.checkReady(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
}

// checkStore does what etcd's health check does: a linearizable read.
func (s *Server) checkStore(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.store.Range(ctx, &pb.RangeRequest{Key: []byte("health")})
	return err
}

// serveHealth answers as etcd's /health: unhealthy while an alarm is raised
// (unless the request excludes its type with ?exclude=NOSPACE) or the store
// cannot be read; GET only.
func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	body := s.alarmHealth(r.URL.Query()["exclude"])
	if body.Health == "true" {
		if err := s.checkStore(r.Context()); err != nil {
			body = healthBody{Health: "false", Reason: "QGET ERROR:" + err.Error()}
		}
	}
	d, _ := json.Marshal(body)
	if body.Health != "true" {
		http.Error(w, string(d), http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(d)
}

// alarmHealth is etcd's alarm check of /health: the first raised alarm
// whose type is not excluded makes the member unhealthy.
func (s *Server) alarmHealth(excluded []string) healthBody {
	for _, a := range s.ops.alarms.Cached(pb.AlarmType_NONE) {
		skip := false
		for _, e := range excluded {
			skip = skip || e == a.Alarm.String()
		}
		if skip {
			continue
		}
		switch a.Alarm {
		case pb.AlarmType_NOSPACE:
			return healthBody{Health: "false", Reason: "ALARM NOSPACE"}
		case pb.AlarmType_CORRUPT:
			return healthBody{Health: "false", Reason: "ALARM CORRUPT"}
		default:
			return healthBody{Health: "false", Reason: "ALARM UNKNOWN"}
		}
	}
	return healthBody{Health: "true"}
}
