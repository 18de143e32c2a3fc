// Applying a decoded frame to a Table, and diffing two tables into a frame.

package table

import (
	"fmt"
	"slices"
)

// Diff returns the delta that takes old to next: changed models with their full replica
// lists and config, key upserts and removals; models whose block geometry changed are
// reset (their keys mean something else now).
func Diff(old, next *Table) *Frame {
	f := &Frame{Format: next.Format, Kind: Delta, Version: next.Version, Base: old.Version, GeneratedMs: next.GeneratedMs}
	for _, name := range next.ModelNames() {
		nm := next.Models[name]
		om, ok := old.Models[name]
		mc := ModelChange{Name: name, Config: nm.Config, Replicas: nm.Replicas, Tiers: nm.Tiers}
		if !ok || !om.Config.SameGeometry(nm.Config) {
			mc.Reset = true
			nm.Each(func(k uint64, s []uint32) bool { mc.Upserts.Add(k, s...); return true })
			nm.EachHome(func(k uint64, s uint32) bool { mc.Homes.Add(k, s); return true })
		} else {
			diffEntries(om, nm, &mc)
			diffHomes(om, nm, &mc)
		}
		f.Models = append(f.Models, mc)
	}
	for _, name := range old.ModelNames() {
		if _, ok := next.Models[name]; !ok {
			f.Models = append(f.Models, ModelChange{Name: name, Removed: true})
		}
	}
	return f
}

func diffEntries(om, nm *Model, mc *ModelChange) {
	type entry struct {
		k uint64
		s []uint32
	}
	flat := func(m *Model) []entry {
		out := make([]entry, 0, m.Len())
		m.Each(func(k uint64, s []uint32) bool { out = append(out, entry{k, s}); return true })
		return out
	}
	o, n := flat(om), flat(nm)
	i, j := 0, 0
	for i < len(o) || j < len(n) {
		switch {
		case j == len(n) || (i < len(o) && o[i].k < n[j].k):
			mc.Removes = append(mc.Removes, o[i].k)
			i++
		case i == len(o) || n[j].k < o[i].k:
			mc.Upserts.Add(n[j].k, n[j].s...)
			j++
		default:
			if !slices.Equal(o[i].s, n[j].s) {
				mc.Upserts.Add(n[j].k, n[j].s...)
			}
			i++
			j++
		}
	}
}

func diffHomes(om, nm *Model, mc *ModelChange) {
	nm.EachHome(func(k uint64, s uint32) bool {
		if o, ok := om.HomeOf(k); !ok || o != s {
			mc.Homes.Add(k, s)
		}
		return true
	})
	om.EachHome(func(k uint64, _ uint32) bool {
		if _, ok := nm.HomeOf(k); !ok {
			mc.Homes.Removes = append(mc.Homes.Removes, k)
		}
		return true
	})
}

// Apply decodes b and applies it to t: a full frame replaces t, a delta must have t's
// version as its base. On any error t is unchanged.
func (t *Table) Apply(b []byte) (*Frame, error) {
	f, err := Decode(b)
	if err != nil {
		return nil, err
	}
	return f, t.ApplyFrame(f)
}

// ApplyFrame applies a decoded frame (see Apply).
func (t *Table) ApplyFrame(f *Frame) error {
	if f.Kind == Delta && f.Base != t.Version {
		return fmt.Errorf("%w: delta %d->%d, table at %d", ErrBaseMismatch, f.Base, f.Version, t.Version)
	}
	format := normFormat(f.Format)
	if f.Kind == Delta && t.Format != 0 && t.Format != format {
		// The same version holds GPU holders only in format 1 and every tier in format
		// 2: a delta of the other format would leave a mix.
		return fmt.Errorf("%w: format %d delta, table in format %d", ErrBaseMismatch, format, t.Format)
	}
	// Stage every change first so a bad section leaves t as it was.
	staged := make([]*Model, len(f.Models))
	for i := range f.Models {
		mc := &f.Models[i]
		if mc.Removed {
			continue
		}
		if !mc.Reset {
			if _, ok := t.Models[mc.Name]; !ok {
				return fmt.Errorf("%w: delta v%d changes unknown model %q", ErrBaseMismatch, f.Version, mc.Name)
			}
		}
		rs := mc.Replicas
		if mc.Patched {
			var err error
			if rs, err = mc.patchedReplicas(t.Models[mc.Name], t.GeneratedMs, f.GeneratedMs); err != nil {
				return fmt.Errorf("%w: %v", ErrCorrupt, err)
			}
		}
		m, err := NewModel(mc.Name, mc.Config, rs)
		if err == nil {
			err = m.SetTiers(mc.Tiers)
		}
		if err != nil {
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		for j := 0; j < mc.Upserts.Len(); j++ {
			k, slots := mc.Upserts.At(j)
			for _, h := range slots {
				s, tier := SplitHolder(h)
				if m.ReplicaIndex(s) < 0 || tier > len(m.Tiers) {
					return fmt.Errorf("%w: model %q key %#x names slot %d tier %d, which has no replica or tier", ErrCorrupt, mc.Name, k, s, tier)
				}
			}
		}
		if err := mc.Homes.check(mc.Reset); err != nil {
			return fmt.Errorf("%w: model %q: %v", ErrCorrupt, mc.Name, err)
		}
		staged[i] = m
	}
	models := t.Models
	if f.Kind == Full {
		models = map[string]*Model{}
	}
	for i := range f.Models {
		mc := &f.Models[i]
		switch {
		case mc.Removed:
			delete(models, mc.Name)
		case mc.Reset:
			m := staged[i]
			m.entries.loadSorted(&mc.Upserts)
			mc.Homes.apply(m, true)
			m.touch()
			models[mc.Name] = m
		default:
			m := models[mc.Name]
			m.Config = mc.Config
			m.Replicas, m.slotIdx = staged[i].Replicas, staged[i].slotIdx
			m.Tiers = staged[i].Tiers
			for j := 0; j < mc.Upserts.Len(); j++ {
				k, slots := mc.Upserts.At(j)
				m.entries.upsert(k, slots)
			}
			for _, k := range mc.Removes {
				m.entries.remove(k)
			}
			mc.Homes.apply(m, false)
			m.touch()
		}
	}
	t.Models, t.Version, t.GeneratedMs, t.Format = models, f.Version, f.GeneratedMs, format
	return nil
}

// loadSorted fills empty entries from a sorted, unique list, straight into the base.
func (e *entries) loadSorted(u *Entries) {
	e.reset()
	e.keys = slices.Clone(u.Keys)
	e.sets = make([]uint32, len(u.Keys))
	for i := range u.Keys {
		_, s := u.At(i)
		e.sets[i] = e.pool.intern(s)
	}
	e.live = len(e.keys)
	e.buildIndex()
}
