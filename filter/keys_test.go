package main

import "testing"

// The shared-data names are read by other VMs, some of an older filter during a
// configuration reload, so they must not move: an unsharded report queue moved to
// kvroute/kvroute/reports/v2 would leave an older VM's reports, enqueued on
// kvroute/reports/v2, never posted by a newer leader.
func TestSharedDataKeysKeepTheirNames(t *testing.T) {
	for _, c := range []struct {
		shard                 string
		head, queue, base, dl string
	}{
		{"", "kvroute/head", "kvroute/reports/v2", "kvroute/base/1/0", "kvroute/delta/2"},
		{"qwen", "kvroute/shard/qwen/head", "kvroute/shard/qwen/reports/v2", "kvroute/shard/qwen/base/1/0", "kvroute/shard/qwen/delta/2"},
	} {
		k := newKeys(c.shard)
		if k.head != c.head || k.queue != c.queue || k.base(1, 0) != c.base || k.delta(2) != c.dl {
			t.Errorf("shard %q: head %q queue %q base %q delta %q; want %q %q %q %q",
				c.shard, k.head, k.queue, k.base(1, 0), k.delta(2), c.head, c.queue, c.base, c.dl)
		}
	}
}
