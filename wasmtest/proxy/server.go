package proxy

import (
	"context"
	"net"
	"net/http"
)

// Server is a Proxy listening on a local address.
type Server struct {
	*Proxy
	// URL is the base URL clients use, e.g. "http://127.0.0.1:41234".
	URL string
	srv *http.Server
	ln  net.Listener
}

// Listen starts a proxy for cfg on addr ("" picks a free port on 127.0.0.1).
func Listen(addr string, cfg Config) (*Server, error) {
	p, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{Proxy: p, URL: "http://" + ln.Addr().String(), srv: &http.Server{Handler: p}, ln: ln}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Addr returns the listening address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Close stops the server at once and drops idle upstream connections.
func (s *Server) Close() error {
	err := s.srv.Close()
	s.Proxy.Close()
	return err
}

// Shutdown stops the server once in-flight requests are done.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.srv.Shutdown(ctx)
	s.Proxy.Close()
	return err
}
