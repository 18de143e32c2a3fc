package host

import (
	"runtime"
	"syscall"
	"time"
	"unsafe"
)

// threadClock measures a callback in the CPU time of the thread that runs it
// (CLOCK_THREAD_CPUTIME_ID): the goroutine is locked to its thread from start to stop,
// so the time the OS gave other work on a shared machine is not counted.
type threadClock struct{ start int64 }

const clockThreadCPUTime = 3 // CLOCK_THREAD_CPUTIME_ID

func threadNanos() int64 {
	var ts syscall.Timespec
	if _, _, e := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTime, uintptr(unsafe.Pointer(&ts)), 0); e != 0 {
		return time.Now().UnixNano()
	}
	return ts.Nano()
}

func (c *threadClock) begin() {
	runtime.LockOSThread()
	c.start = threadNanos()
}

func (c *threadClock) end() time.Duration {
	d := time.Duration(threadNanos() - c.start)
	runtime.UnlockOSThread()
	return d
}
