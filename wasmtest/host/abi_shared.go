package host

// Host functions for shared data and shared queues (cpp-host src/shared_data.cc,
// src/shared_queue.cc at 3930b7b).

func hostGetSharedData(vm *VM, a []uint64) status {
	key, ok := vm.readString(a[0], a[1])
	if !ok {
		return statusInvalidMemoryAccess
	}
	value, cas, found := vm.host.store.get(key)
	if !found {
		return statusNotFound
	}
	if st := vm.copyOut(value, a[2], a[3]); st != statusOK {
		return st
	}
	return vm.writeU32(a[4], cas)
}

func hostSetSharedData(vm *VM, a []uint64) status {
	key, ok1 := vm.readString(a[0], a[1])
	value, ok2 := vm.read(a[2], a[3])
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	return vm.host.store.set(key, value, uint32(a[4]))
}

func hostRegisterSharedQueue(vm *VM, a []uint64) status {
	name, ok := vm.readString(a[0], a[1])
	if !ok {
		return statusInvalidMemoryAccess
	}
	// proxy_on_queue_ready goes to the root context even if a stream registers the queue.
	return vm.writeU32(a[2], vm.host.store.register(name, vm, vm.rootID))
}

func hostResolveSharedQueue(vm *VM, a []uint64) status {
	vmID, ok1 := vm.readString(a[0], a[1])
	name, ok2 := vm.readString(a[2], a[3])
	if !ok1 || !ok2 {
		return statusInvalidMemoryAccess
	}
	if vmID != vm.host.cfg.VMID {
		return statusNotFound
	}
	id := vm.host.store.resolve(name)
	if id == 0 {
		return statusNotFound
	}
	return vm.writeU32(a[4], id)
}

func hostDequeueSharedQueue(vm *VM, a []uint64) status {
	item, st := vm.host.store.dequeue(uint32(a[0]))
	if st != statusOK {
		return st
	}
	return vm.copyOut(item, a[1], a[2])
}

// hostEnqueueSharedQueue wakes the registering VM later, through the clock: never inside
// the enqueuing callback, even when that VM is the one enqueuing.
func hostEnqueueSharedQueue(vm *VM, a []uint64) status {
	item, ok := vm.read(a[1], a[2])
	if !ok {
		return statusInvalidMemoryAccess
	}
	token := uint32(a[0])
	target, contextID, st := vm.host.store.enqueue(token, item)
	if st != statusOK {
		return st
	}
	if target != nil {
		vm.host.clock.AfterFunc(0, func() { target.deliverQueueReady(contextID, token) })
	}
	return statusOK
}
