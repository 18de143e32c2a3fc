package kvevents

import (
	"reflect"
	"testing"
)

// resetEvent clears every field of Event (it lists them one by one), keeping only the
// slices' arrays.
func TestResetEventClearsEveryField(t *testing.T) {
	var e Event
	v := reflect.ValueOf(&e).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int64:
			f.SetInt(7)
		case reflect.Uint8, reflect.Uint64:
			f.SetUint(7)
		case reflect.String:
			f.SetString("x")
		case reflect.Slice:
			f.Set(reflect.MakeSlice(f.Type(), 2, 3))
		default:
			t.Fatalf("field %s of kind %s: teach this test (and resetEvent) about it", v.Type().Field(i).Name, f.Kind())
		}
	}
	resetEvent(&e)
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		if f.Kind() == reflect.Slice {
			if f.Len() != 0 || f.Cap() != 3 {
				t.Errorf("%s: len %d cap %d, want 0 and the array kept", name, f.Len(), f.Cap())
			}
		} else if !f.IsZero() {
			t.Errorf("%s not cleared: %v", name, f)
		}
	}
}
