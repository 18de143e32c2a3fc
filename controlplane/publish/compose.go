// Deltas for pollers more than one version behind: composed from the versions between,
// with the replica patches of format 2 on and format 1's GPU-only view.

package publish

import (
	"slices"

	"github.com/kvroute/kvroute/shared/table"
)

// patched is f (a delta from base, whole replica lists) in format, 2 to 4, with the
// replica list of every model base has patched: only what changed since base, as that
// format carries it.
func patched(f *table.Frame, base *table.Table, format uint8) *table.Frame {
	out := *f
	out.Format = format
	out.Models = slices.Clone(f.Models)
	for i := range out.Models {
		if m := base.Models[out.Models[i].Name]; m != nil {
			out.Models[i].PatchReplicasFormat(m.Replicas, base.GeneratedMs, f.GeneratedMs, format)
		}
	}
	return &out
}

// compose builds the delta from version have to the current one from the keys that
// changed in between, valued as the current table holds them. It returns nil when a
// full frame would be smaller. Caller holds mu (read).
func (p *Publisher) compose(have uint64, model string, format uint8) *table.Frame {
	type acc struct {
		reset, removed bool
		keys, homes    []uint64
	}
	accs := map[string]*acc{}
	var names []string
	total := 0
	for _, rec := range p.hist {
		if rec.v <= have {
			continue
		}
		for name, ch := range rec.models {
			if model != "" && name != model {
				continue
			}
			a := accs[name]
			if a == nil {
				a = &acc{}
				accs[name] = a
				names = append(names, name)
			}
			switch {
			case ch.removed:
				*a = acc{removed: true}
			case ch.reset:
				// A Reset section must list every key; every key the model has now
				// changed at or after its (re)creation, so these versions cover it.
				*a = acc{reset: true, keys: append([]uint64(nil), ch.view(format)...)}
			default:
				a.keys = append(a.keys, ch.view(format)...)
			}
			if format >= table.FormatHomes {
				a.homes = append(a.homes, ch.homes...)
				total += len(ch.homes)
			}
			total += len(ch.view(format))
			if total > p.maxKeys {
				return nil
			}
		}
	}
	slices.Sort(names)
	f := &table.Frame{Format: format, Kind: table.Delta, Version: p.t.Version, Base: have, GeneratedMs: p.t.GeneratedMs}
	// Formats 2 on carry only the replicas that changed since have, when have is
	// recent enough for its replicas to be known.
	var baseRec *version
	if i := have - p.hist[0].v; format >= table.FormatTiers && have >= p.hist[0].v && i < uint64(len(p.hist)) &&
		p.hist[i].v == have && p.hist[i].replicas != nil {
		baseRec = &p.hist[i]
	}
	for _, name := range names {
		a := accs[name]
		m := p.t.Models[name]
		if m == nil {
			f.Models = append(f.Models, table.ModelChange{Name: name, Removed: true})
			continue
		}
		mc := table.ModelChange{Name: name, Reset: a.reset, Config: m.Config, Replicas: m.Replicas}
		if format >= table.FormatTiers {
			mc.Tiers = m.Tiers
			if rs, ok := baseRec.replicasOf(name); ok {
				mc.PatchReplicasFormat(rs, baseRec.gen, f.GeneratedMs, format)
			}
		}
		slices.Sort(a.keys)
		for _, k := range slices.Compact(a.keys) {
			s := m.Lookup(k)
			if format < table.FormatTiers {
				s = table.GPUPart(s)
			}
			if len(s) > 0 {
				mc.Upserts.Add(k, s...)
			} else if !a.reset {
				mc.Removes = append(mc.Removes, k)
			}
		}
		slices.Sort(a.homes)
		for _, k := range slices.Compact(a.homes) {
			if s, ok := m.HomeOf(k); ok {
				mc.Homes.Add(k, s)
			} else if !a.reset {
				mc.Homes.Removes = append(mc.Homes.Removes, k)
			}
		}
		f.Models = append(f.Models, mc)
	}
	return f
}

// replicasOf is model name's replicas in version v, if known.
func (v *version) replicasOf(name string) ([]table.Replica, bool) {
	if v == nil {
		return nil, false
	}
	rs, ok := v.replicas[name]
	return rs, ok
}

// gpuChange is mc as a format-1 filter sees it, given the model's holders before the
// version (old, nil for a new model): GPU holders only, without the keys whose change
// was in slower tiers alone. That is the section a control plane without slower tiers
// sends for the same GPU holdings (it would not have seen those changes). It records
// the keys it keeps in ch.gpuKeys when they differ from ch.keys.
func gpuChange(old *table.Model, mc *table.ModelChange, ch *change) table.ModelChange {
	out := table.ModelChange{Name: mc.Name, Removed: mc.Removed, Reset: mc.Reset, Config: mc.Config, Replicas: mc.Replicas}
	if mc.Removed {
		return out
	}
	if old == nil || mc.Reset {
		old = &table.Model{} // every lookup empty
	}
	var gone, kept []uint64
	for j := 0; j < mc.Upserts.Len(); j++ {
		k, s := mc.Upserts.At(j)
		o := old.Lookup(k)
		g, og := table.GPUPart(s), table.GPUPart(o)
		switch {
		case len(g) > 0 && (!slices.Equal(g, og) || slices.Equal(s, o)):
			out.Upserts.Add(k, g...)
		case len(g) == 0 && len(og) > 0:
			gone = append(gone, k) // left GPU memory: gone for a format-1 filter
		default:
			continue // only slower tiers changed
		}
		kept = append(kept, k)
	}
	for _, k := range mc.Removes {
		if o := old.Lookup(k); len(o) == 0 || len(table.GPUPart(o)) > 0 {
			gone = append(gone, k)
			kept = append(kept, k)
		}
	}
	slices.Sort(gone)
	out.Removes = gone
	if len(kept) != len(ch.keys) {
		slices.Sort(kept)
		ch.gpuKeys = append([]uint64{}, kept...)
	}
	return out
}
