package controlplane

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/controlplane/discovery"
)

// Listening where other hosts reach the API needs a token or an explicit opt-out.
func TestListenNeedsToken(t *testing.T) {
	eng := []discovery.Engine{{ID: "e1", Model: "m", Addr: "127.0.0.1:1"}}
	for _, tc := range []struct {
		listen, token string
		insecure      bool
		ok            bool
	}{
		{"127.0.0.1:0", "", false, true},
		{"[::1]:0", "", false, true},
		{"localhost:0", "", false, true},
		{"0.0.0.0:8080", "", false, false},
		{":8080", "", false, false},
		{"10.0.0.5:8080", "", false, false},
		{"0.0.0.0:8080", "tok", false, true},
		{"0.0.0.0:8080", "", true, true},
	} {
		_, err := New(Options{Listen: tc.listen, Token: tc.token, InsecureNoToken: tc.insecure, Engines: eng, Logger: quiet()})
		if (err == nil) != tc.ok {
			t.Errorf("listen %q token %q insecure %v: err = %v", tc.listen, tc.token, tc.insecure, err)
		}
		if err != nil && (!strings.Contains(err.Error(), "--insecure-no-token") || strings.Contains(err.Error(), "\n")) {
			t.Errorf("listen %q: the error must be one line naming the flag: %q", tc.listen, err)
		}
	}
}

// A listener given in Options is served (and its address is what the exposure check
// reads: a wildcard one needs a token like --listen's), and it is closed at shutdown.
func TestServesTheListenerItIsGiven(t *testing.T) {
	eng := []discovery.Engine{{ID: "e1", Model: "m", Addr: "127.0.0.1:1"}}
	wide, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer wide.Close()
	if _, err := New(Options{Listener: wide, Engines: eng, Logger: quiet()}); err == nil {
		t.Error("a wildcard listener was accepted without a token")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cp, err := New(Options{Listen: "127.0.0.1:9", Listener: ln, Engines: eng, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := cp.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if cp.Addr() != ln.Addr().String() {
		t.Errorf("serving on %s, given %s", cp.Addr(), ln.Addr())
	}
	resp, err := http.Get("http://" + ln.Addr().String() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %s", resp.Status)
	}
	cancel()
	cp.Wait()
	if _, err := ln.Accept(); err == nil || !errors.Is(err, net.ErrClosed) {
		t.Errorf("the listener is open after shutdown: %v", err)
	}
}
