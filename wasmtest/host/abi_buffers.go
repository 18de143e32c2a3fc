package host

// Host functions for body and configuration buffers.

// buffer returns the buffer the current context may use and whether it may change it.
func (vm *VM) buffer(typ uint32) (*[]byte, bool, status) {
	switch typ {
	case bufRequestBody, bufResponseBody:
		s := vm.effectiveStream()
		if s == nil {
			return nil, false, statusNotFound
		}
		hf := &s.req
		if typ == bufResponseBody {
			hf = &s.resp
		}
		if !hf.bodyOpen {
			return nil, false, statusNotFound
		}
		return &hf.body, true, statusOK
	case bufCallResponseBody:
		if vm.callResp == nil {
			return nil, false, statusNotFound
		}
		return &vm.callResp.body, false, statusOK
	case bufVMConfiguration:
		return &vm.host.cfg.VMConfig, false, statusOK
	case bufPluginConfig:
		if !vm.configuring {
			return nil, false, statusNotFound // Envoy only hands it out inside proxy_on_configure
		}
		return &vm.host.cfg.PluginConfig, false, statusOK
	}
	return nil, false, statusNotFound
}

func hostGetBufferBytes(vm *VM, a []uint64) status {
	if a[0] > bufMax {
		return statusBadArgument
	}
	buf, _, st := vm.buffer(uint32(a[0]))
	if st != statusOK {
		return st
	}
	start, length := uint64(uint32(a[1])), uint64(uint32(a[2]))
	size := uint64(len(*buf))
	if start > size {
		return statusOK // nothing to return; the SDK reports NotFound
	}
	if start+length > size {
		length = size - start
	}
	if length == 0 {
		return statusOK
	}
	return vm.copyOut((*buf)[start:start+length], a[3], a[4])
}

// hostSetBufferBytes follows Envoy's Buffer::copyFrom: (0, 0) prepends, (0, >= size)
// replaces, (>= size, _) appends; anything else is a bad argument.
func hostSetBufferBytes(vm *VM, a []uint64) status {
	if a[0] > bufMax {
		return statusBadArgument
	}
	buf, writable, st := vm.buffer(uint32(a[0]))
	if st != statusOK {
		return st
	}
	if !writable {
		return statusBadArgument
	}
	data, ok := vm.read(a[3], a[4])
	if !ok {
		return statusInvalidMemoryAccess
	}
	start, length := uint64(uint32(a[1])), uint64(uint32(a[2]))
	size := uint64(len(*buf))
	switch {
	case start == 0 && length == 0:
		*buf = append(data, *buf...)
	case start == 0 && length >= size:
		*buf = data
	case start >= size:
		*buf = append(*buf, data...)
	default:
		return statusBadArgument
	}
	return statusOK
}
