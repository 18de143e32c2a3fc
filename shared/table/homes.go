// A model's homes: checkpoint keys the table lists on no replica, each with the slot of
// the replica that held it last (format 4).

package table

import "fmt"

// Where a fleet's KV caches cannot hold its working set, a document's or a
// conversation's prefix is often evicted everywhere between two of its requests, and
// the table then lists it nowhere. The control plane remembers, for a bounded number of
// such keys, which replica let each go last, and the filters send the prefix back there
// (route.Router's home credit, docs/rule.md "Homes"): every proxy, since the control
// plane sees every proxy's placements. A home is a hint, not a holding: nothing in the
// entries, no tier, and never counted as cached.
//
// Homes are kept apart from the entries (their own sorted keys and overlay), so a match
// reads them only when it asks for a home, and a frame of an older format, which has no
// homes, needs no view of the entries without them.

// HomeChanges are a frame section's homes: Keys (strictly increasing) set to the slots
// at the same index, then Removes (strictly increasing) forgotten. A reset section's
// Keys are all its homes, and it has no Removes.
type HomeChanges struct {
	Keys    []uint64
	Slots   []uint32
	Removes []uint64
}

// Add appends a home; keys must be added in increasing order.
func (h *HomeChanges) Add(key uint64, slot uint32) {
	h.Keys = append(h.Keys, key)
	h.Slots = append(h.Slots, slot)
}

// Empty says whether h changes nothing.
func (h *HomeChanges) Empty() bool { return len(h.Keys) == 0 && len(h.Removes) == 0 }

// apply sets h's homes on m: loaded whole into a reset model, else one by one.
func (h *HomeChanges) apply(m *Model, reset bool) {
	if reset {
		var e Entries
		for i, k := range h.Keys {
			e.Add(k, h.Slots[i])
		}
		m.homes.loadSorted(&e)
		return
	}
	for i, k := range h.Keys {
		m.homes.upsert(k, []uint32{h.Slots[i]})
	}
	for _, k := range h.Removes {
		m.homes.remove(k)
	}
}

// check says what is wrong with h, or nil.
func (h *HomeChanges) check(reset bool) error {
	if len(h.Keys) != len(h.Slots) {
		return fmt.Errorf("%d home keys with %d slots", len(h.Keys), len(h.Slots))
	}
	for _, s := range h.Slots {
		if s > MaxSlot {
			return fmt.Errorf("home in slot %d, above %d", s, MaxSlot)
		}
	}
	if reset && len(h.Removes) > 0 {
		return fmt.Errorf("a reset section removes %d homes", len(h.Removes))
	}
	return nil
}

// Home returns the replica (its index in Replicas) that held last the longest prefix of
// keys (a request's chain) the table remembers a home for, and that prefix's length in
// blocks; -1 and 0 when it remembers none whose replica the model still has.
func (m *Model) Home(keys []uint64) (int, int) {
	if m.homes.len() == 0 {
		return -1, 0
	}
	stride := max(int(m.Config.Stride), 1)
	for i := (len(keys)/stride)*stride - 1; i >= 0; i -= stride {
		id, ok := m.homes.get(keys[i])
		if !ok {
			continue
		}
		if s := m.homes.pool.get(id); len(s) == 1 {
			if r := m.ReplicaIndex(s[0]); r >= 0 {
				return r, i + 1
			}
		}
	}
	return -1, 0
}

// SetHome records that the replica in slot held key last; the key must be one the
// entries do not list. Slot need not be a current replica's: a home whose replica has
// left is ignored (Home).
func (m *Model) SetHome(key uint64, slot uint32) error {
	if slot > MaxSlot {
		return fmt.Errorf("model %q: home of key %#x in slot %d, above %d", m.Name, key, slot, MaxSlot)
	}
	m.touch()
	m.homes.upsert(key, []uint32{slot})
	return nil
}

// RemoveHome forgets key's home.
func (m *Model) RemoveHome(key uint64) {
	m.touch()
	m.homes.remove(key)
}

// HomeOf is key's home: the slot of the replica that held it last.
func (m *Model) HomeOf(key uint64) (uint32, bool) {
	id, ok := m.homes.get(key)
	if !ok {
		return 0, false
	}
	if s := m.homes.pool.get(id); len(s) == 1 {
		return s[0], true
	}
	return 0, false
}

// HomesLen is the number of homes.
func (m *Model) HomesLen() int { return m.homes.len() }

// EachHome calls fn for every home in increasing key order until fn returns false.
func (m *Model) EachHome(fn func(key uint64, slot uint32) bool) {
	m.homes.each(func(k uint64, s []uint32) bool { return fn(k, s[0]) })
}
