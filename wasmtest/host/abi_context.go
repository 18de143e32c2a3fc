package host

import "time"

// Host functions for logging, time, call status, stream control, ticks and foreign
// functions. The one list of host functions is hostFuncs in abi.go.

func hostLog(vm *VM, a []uint64) status {
	level := LogLevel(uint32(a[0]))
	if level > LevelCritical {
		return statusBadArgument
	}
	msg, ok := vm.readString(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	vm.host.logs.add(vm.host.clock.Now(), vm.index, level, msg)
	return statusOK
}

// hostGetLogLevel reports trace: the host keeps every line.
func hostGetLogLevel(vm *VM, a []uint64) status {
	return vm.writeU32(a[0], uint32(LevelTrace))
}

func hostGetCurrentTime(vm *VM, a []uint64) status {
	return vm.writeU64(a[0], uint64(vm.host.clock.Now().UnixNano()))
}

func hostGetStatus(vm *VM, a []uint64) status {
	if st := vm.writeU32(a[0], vm.status.code); st != statusOK {
		return st
	}
	return vm.copyOut([]byte(vm.status.message), a[1], a[2])
}

// Local reply and stream control: deferred until the callback returns, like cpp-host's
// addAfterVmCallAction.

func hostSendLocalResponse(vm *VM, a []uint64) status {
	s := vm.effectiveStream()
	if s == nil {
		return statusUnimplemented
	}
	details, ok1 := vm.readString(a[1], a[2])
	body, ok2 := vm.read(a[3], a[4])
	raw, ok3 := vm.read(a[5], a[6])
	if !ok1 || !ok2 || !ok3 {
		return statusInvalidMemoryAccess
	}
	hdrs, _ := decodePairs(raw) // cpp-host ignores malformed pairs
	s.localRequested = true
	vm.after = append(vm.after, afterAction{stream: s, ev: streamEvent{kind: evLocalReply,
		reply: &localReply{status: int(uint32(a[0])), headers: hdrs, body: body, details: details}}})
	return statusOK
}

func hostContinueStream(vm *VM, a []uint64) status {
	typ := uint32(a[0])
	if typ > 3 {
		return statusBadArgument
	}
	s := vm.effectiveStream()
	if s == nil || typ > 1 {
		return statusOK // no HTTP stream to continue (Envoy does nothing either)
	}
	d := direction(typ)
	hf := s.half(d)
	// Envoy releases the maps at once; the stream moves on after the callback.
	hf.headersOpen, hf.bodyOpen, hf.trailersOpen = false, false, false
	vm.after = append(vm.after, afterAction{stream: s, ev: streamEvent{kind: evContinue, dir: d}})
	return statusOK
}

func hostCloseStream(vm *VM, a []uint64) status {
	typ := uint32(a[0])
	if typ > 3 {
		return statusBadArgument
	}
	if s := vm.effectiveStream(); s != nil && typ <= 1 {
		vm.after = append(vm.after, afterAction{stream: s, ev: streamEvent{kind: evReset, reason: "closed by the filter"}})
	}
	return statusOK
}

func hostSetEffectiveContext(vm *VM, a []uint64) status {
	id := uint32(a[0])
	if id != vm.rootID && vm.streams[id] == nil {
		return statusBadArgument
	}
	vm.effective = id
	return statusOK
}

func hostSetTickPeriod(vm *VM, a []uint64) status {
	vm.setTickPeriod(time.Duration(uint32(a[0])) * time.Millisecond)
	return statusOK
}

// clear_route_cache is the one foreign function Envoy offers that matters here; the host
// has no route cache, so it succeeds and does nothing.
func hostCallForeignFunction(vm *VM, a []uint64) status {
	name, ok := vm.readString(a[0], a[1])
	if !ok {
		return statusInvalidMemoryAccess
	}
	if name != "clear_route_cache" {
		return statusNotFound
	}
	if a[4] != 0 {
		if st := vm.writeU32(a[4], 0); st != statusOK {
			return st
		}
	}
	if a[5] != 0 {
		return vm.writeU32(a[5], 0)
	}
	return statusOK
}
