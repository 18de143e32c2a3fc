//go:build !linux

package host

import "context"

// withReservedMemory leaves wazero's own memory, which grows by copying (see
// memory_linux.go), where mmap and mprotect are not used.
func withReservedMemory(ctx context.Context) context.Context { return ctx }
