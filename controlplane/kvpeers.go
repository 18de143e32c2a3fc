package controlplane

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute/controlplane/discovery"
)

// With --kv-bind, engines connect to the control plane and name themselves by topic;
// anyone who reaches the port could name any replica (one message with a high sequence
// number would wipe its keys). A topic is therefore accepted only from the
// address of the engine it names: the hosts of its addr, metrics URL and KV endpoints
// (names resolved, cached for peerTTL), or an address in --kv-bind-allow. go-zeromq
// tells nobody which connection a message came from, so the check runs in the capped
// transport, which sees each message's topic frame on its connection
// (kvevents.PeerCheck); a refused message never completes and the peer's connection is
// dropped and counted.

const peerTTL = 30 * time.Second

type peerCache struct {
	mu   sync.Mutex
	byID map[string]peerEntry
}

type peerEntry struct {
	key   string // the replica's hosts, to notice a changed spec
	addrs []netip.Addr
	at    time.Time
}

// replicaHosts are the hosts that name replica r's engine.
func replicaHosts(r discovery.Replica) []string {
	var hosts []string
	add := func(h string) {
		if h != "" && !strings.Contains(h, "*") {
			hosts = append(hosts, strings.Trim(h, "[]"))
		}
	}
	if h, _, err := net.SplitHostPort(r.Addr); err == nil {
		add(h)
	}
	if u, err := url.Parse(r.Metrics); err == nil {
		add(u.Hostname())
	}
	for _, s := range r.Streams {
		for _, ep := range []string{s.Endpoint, s.Replay} {
			if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
				if h, _, err := net.SplitHostPort(rest); err == nil {
					add(h)
				}
			}
		}
	}
	return hosts
}

// peerAllowed says whether a message naming topic (on DP rank's socket) may come from
// remote. Topics that name no replica pass: the subscription counts them as unknown.
func (c *ControlPlane) peerAllowed(topic []byte, rank int, remote net.Addr) bool {
	src, ok := c.resolveTopic(string(topic), rank)
	if !ok {
		return true
	}
	ta, ok := remote.(*net.TCPAddr)
	if !ok {
		return true // ipc/inproc: local by construction
	}
	ip, _ := netip.AddrFromSlice(ta.IP)
	ip = ip.Unmap()
	for _, p := range c.o.KVBindAllow {
		if p.Contains(ip) {
			return true
		}
	}
	c.mu.Lock()
	r, known := c.replicas[src.ID.Replica]
	c.mu.Unlock()
	if known {
		for _, a := range c.peers.addrs(r) {
			if a == ip {
				return true
			}
		}
	}
	c.impostors.Inc()
	c.log.Warn("kv events: dropped a message from an address that is not the engine its topic names",
		"replica", src.ID.Replica, "rank", rank, "remote", ip.String())
	return false
}

// addrs are replica r's engine addresses, resolved at most every peerTTL.
func (pc *peerCache) addrs(r discovery.Replica) []netip.Addr {
	hosts := replicaHosts(r)
	key := strings.Join(hosts, ",")
	pc.mu.Lock()
	if pc.byID == nil {
		pc.byID = map[string]peerEntry{}
	}
	e, ok := pc.byID[r.ID]
	pc.mu.Unlock()
	if ok && e.key == key && time.Since(e.at) < peerTTL {
		return e.addrs
	}
	var out []netip.Addr
	for _, h := range hosts {
		if ip, err := netip.ParseAddr(h); err == nil {
			out = append(out, ip.Unmap())
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", h)
		cancel()
		if err == nil {
			for _, ip := range ips {
				out = append(out, ip.Unmap())
			}
		}
	}
	pc.mu.Lock()
	if len(pc.byID) > 8192 { // replicas come and go: forget them all now and then
		clear(pc.byID)
	}
	pc.byID[r.ID] = peerEntry{key: key, addrs: out, at: time.Now()}
	pc.mu.Unlock()
	return out
}

// ParseAllow parses --kv-bind-allow: comma-separated IPs or CIDR prefixes.
func ParseAllow(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if ip, err := netip.ParseAddr(f); err == nil {
			out = append(out, netip.PrefixFrom(ip.Unmap(), ip.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
