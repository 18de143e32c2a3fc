package route

import (
	"reflect"
	"testing"
)

// pointerPath names a field of t through which a value of t holds a pointer (a string,
// slice, map, interface, func, channel or pointer), or "" if it holds none.
func pointerPath(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if p := pointerPath(f.Type); p != "" {
				return f.Name + "." + p
			}
		}
		return ""
	case reflect.Array:
		return pointerPath(t.Elem())
	case reflect.String, reflect.Slice, reflect.Map, reflect.Interface, reflect.Func,
		reflect.Chan, reflect.Pointer, reflect.UnsafePointer:
		return t.Kind().String()
	}
	return ""
}

// The slabs the guest keeps thousands of entries in hold no pointer, so its collector
// does not scan them. With an address string and two time.Times in each ledger entry and
// a model pointer in each Local placement, a collection of the guest marked for about
// 5 ms (BenchmarkKvrouteRequestPath -guestprofile, runtime.gcDrainN), all of it inside
// one or two requests: the slowest request of 20,000 took 10-25 ms of guest CPU. Without
// them: 1.1 ms, the slowest 2.2-7.5 ms.
func TestGuestSlabsHoldNoPointers(t *testing.T) {
	for _, v := range []any{sent{}, localPlacement{}, localEntry{}, ref{}} {
		if p := pointerPath(reflect.TypeOf(v)); p != "" {
			t.Errorf("%T holds a pointer: %s", v, p)
		}
	}
}
