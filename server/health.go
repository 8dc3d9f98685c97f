package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
)

func cryptoRand(b []byte) (int, error) { return rand.Read(b) }

type healthBody struct {
	Health string `json:"health"`
	Reason string `json:"reason"`
}

// HTTPHandler serves etcd's /health and the Kubernetes-style /livez and
// /readyz on the client port.
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/health", s.serveHealth)
	if s.cfg.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
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
	return mux
}

// checkStore does what etcd's health check does: a linearizable read.
func (s *Server) checkStore(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := s.store.Range(ctx, &pb.RangeRequest{Key: []byte("health")})
	return err
}

func (s *Server) serveHealth(w http.ResponseWriter, r *http.Request) {
	body := healthBody{Health: "true"}
	code := http.StatusOK
	if err := s.checkStore(r.Context()); err != nil {
		body = healthBody{Health: "false", Reason: "QGET ERROR:" + err.Error()}
		code = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}
