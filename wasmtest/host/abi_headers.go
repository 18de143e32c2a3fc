package host

// Host functions for header maps.

// headerMap returns the map the current context may use, following which maps Envoy holds
// at that moment; write asks for a mutable one (the log phase and call responses are
// read-only).
func (vm *VM) headerMap(typ uint32, write bool) (*Headers, status) {
	if r := vm.callResp; r != nil && (typ == mapCallResponseHeaders || typ == mapCallResponseTrailers) {
		if write {
			return nil, statusBadArgument
		}
		if typ == mapCallResponseHeaders {
			return &r.headers, statusOK
		}
		return &r.trailers, statusOK
	}
	s := vm.effectiveStream()
	if s == nil {
		return nil, statusBadArgument
	}
	var hf *half
	switch typ {
	case mapRequestHeaders, mapRequestTrailers:
		hf = &s.req
	case mapResponseHeaders, mapResponseTrailers:
		hf = &s.resp
	default:
		return nil, statusBadArgument
	}
	trailers := typ == mapRequestTrailers || typ == mapResponseTrailers
	if s.logPhase {
		if write || (typ == mapRequestTrailers) {
			return nil, statusBadArgument
		}
		if trailers {
			return &hf.trailers, statusOK
		}
		return &hf.headers, statusOK
	}
	if trailers {
		if !hf.trailersOpen {
			return nil, statusBadArgument
		}
		return &hf.trailers, statusOK
	}
	if !hf.headersOpen {
		return nil, statusBadArgument
	}
	return &hf.headers, statusOK
}

func hostGetHeaderMapValue(vm *VM, a []uint64) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	key, ok := vm.readString(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	m, st := vm.headerMap(uint32(a[0]), false)
	if st != statusOK {
		return st
	}
	v, found := m.Lookup(key)
	if !found {
		return statusNotFound
	}
	return vm.copyOut([]byte(v), a[3], a[4])
}

func hostAddHeaderMapValue(vm *VM, a []uint64) status {
	return editHeaderMap(vm, a, func(m *Headers, k, v string) { m.add(k, v) })
}

func hostReplaceHeaderMapValue(vm *VM, a []uint64) status {
	return editHeaderMap(vm, a, func(m *Headers, k, v string) { m.set(k, v) })
}

func editHeaderMap(vm *VM, a []uint64, edit func(m *Headers, k, v string)) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	key, ok1 := vm.readString(a[1], a[2])
	value, ok2 := vm.readString(a[3], a[4])
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	m, st := vm.headerMap(uint32(a[0]), true)
	if st != statusOK {
		return st
	}
	edit(m, key, value)
	return statusOK
}

func hostRemoveHeaderMapValue(vm *VM, a []uint64) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	key, ok := vm.readString(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	m, st := vm.headerMap(uint32(a[0]), true)
	if st != statusOK {
		return st
	}
	m.remove(key)
	return statusOK
}

// hostGetHeaderMapPairs answers an unavailable map with no pairs, as Envoy does.
func hostGetHeaderMapPairs(vm *VM, a []uint64) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	m, st := vm.headerMap(uint32(a[0]), false)
	if st != statusOK || len(*m) == 0 {
		return vm.copyOut(nil, a[1], a[2])
	}
	return vm.copyOut(encodePairs(*m), a[1], a[2])
}

func hostSetHeaderMapPairs(vm *VM, a []uint64) status {
	if a[0] > mapMax {
		return statusBadArgument
	}
	raw, ok := vm.read(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	m, st := vm.headerMap(uint32(a[0]), true)
	if st != statusOK {
		return st
	}
	pairs, _ := decodePairs(raw)
	*m = pairs.lower()
	return statusOK
}
