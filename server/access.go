package server

import (
	"fmt"
	"net"
	"net/http"
	"slices"

	"go.uber.org/zap"
)

// accessControl is etcd's access controller on the client port's HTTP
// side: a plain-HTTP request whose Host is not in --host-whitelist is
// refused (421, against DNS rebinding), and responses carry CORS headers
// for the origins --cors allows; a preflight OPTIONS request is answered
// at once. The defaults ("*") allow every host and origin.
func (s *Server) accessControl(next http.Handler) http.Handler {
	cors, hosts := s.cfg.CORS, s.cfg.HostWhitelist
	anyOrigin := len(cors) == 0 || slices.Contains(cors, "*")
	anyHost := len(hosts) == 0 || slices.Contains(hosts, "*")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil && !anyHost {
			host := hostname(r)
			if !slices.Contains(hosts, host) {
				s.lg.Warn("rejecting HTTP request to prevent DNS rebinding attacks", zap.String("host", host))
				http.Error(w, hostRefusal(host), http.StatusMisdirectedRequest)
				return
			}
		}
		if anyOrigin {
			addCORSHeader(w, "*")
		} else if origin := r.Header.Get("Origin"); slices.Contains(cors, origin) {
			addCORSHeader(w, origin)
		}
		if r.Method == http.MethodOptions {
			w.WriteHeader(http.StatusOK)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func addCORSHeader(w http.ResponseWriter, origin string) {
	h := w.Header()
	h.Add("Access-Control-Allow-Methods", "POST, GET, OPTIONS, PUT, DELETE")
	h.Add("Access-Control-Allow-Origin", origin)
	h.Add("Access-Control-Allow-Headers", "accept, content-type, authorization")
}

// hostname is the request's Host without its port.
func hostname(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.Host); err == nil {
		return h
	}
	return r.Host
}

// hostRefusal is the body of the 421 answer: what to do about it.
func hostRefusal(host string) string {
	return fmt.Sprintf("Host header %q is not allowed on a plain-HTTP port (DNS rebinding protection, CVE-2018-5702): "+
		"use TLS, or add the host to --host-whitelist\n", host)
}
