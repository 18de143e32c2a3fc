package controlplane

import (
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
