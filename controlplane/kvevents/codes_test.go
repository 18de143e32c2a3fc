package kvevents

import (
	"testing"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

func TestCodesMatchMsgpcode(t *testing.T) {
	for _, c := range []struct {
		name      string
		ours, lib byte
	}{
		{"PosFixedNumHigh", codePosFixedNumHigh, msgpcode.PosFixedNumHigh}, {"NegFixedNumLow", codeNegFixedNumLow, msgpcode.NegFixedNumLow},
		{"Nil", codeNil, msgpcode.Nil}, {"False", codeFalse, msgpcode.False}, {"True", codeTrue, msgpcode.True},
		{"Float", codeFloat, msgpcode.Float}, {"Double", codeDouble, msgpcode.Double},
		{"Uint8", codeUint8, msgpcode.Uint8}, {"Uint16", codeUint16, msgpcode.Uint16}, {"Uint32", codeUint32, msgpcode.Uint32}, {"Uint64", codeUint64, msgpcode.Uint64},
		{"Int8", codeInt8, msgpcode.Int8}, {"Int64", codeInt64, msgpcode.Int64},
		{"FixedStrLow", codeFixedStrLow, msgpcode.FixedStrLow}, {"FixedStrHigh", codeFixedStrHigh, msgpcode.FixedStrHigh}, {"FixedStrMask", codeFixedStrMask, msgpcode.FixedStrMask},
		{"Str8", codeStr8, msgpcode.Str8}, {"Str16", codeStr16, msgpcode.Str16}, {"Str32", codeStr32, msgpcode.Str32},
		{"Bin8", codeBin8, msgpcode.Bin8}, {"Bin16", codeBin16, msgpcode.Bin16}, {"Bin32", codeBin32, msgpcode.Bin32},
		{"FixedArrayLow", codeFixedArrayLow, msgpcode.FixedArrayLow}, {"FixedArrayHigh", codeFixedArrayHigh, msgpcode.FixedArrayHigh},
		{"Array16", codeArray16, msgpcode.Array16}, {"Array32", codeArray32, msgpcode.Array32},
		{"FixedMapLow", codeFixedMapLow, msgpcode.FixedMapLow}, {"FixedMapHigh", codeFixedMapHigh, msgpcode.FixedMapHigh},
		{"Map16", codeMap16, msgpcode.Map16}, {"Map32", codeMap32, msgpcode.Map32},
		{"FixExt1", codeFixExt1, msgpcode.FixExt1}, {"FixExt16", codeFixExt16, msgpcode.FixExt16},
		{"Ext8", codeExt8, msgpcode.Ext8}, {"Ext16", codeExt16, msgpcode.Ext16}, {"Ext32", codeExt32, msgpcode.Ext32},
	} {
		if c.ours != c.lib {
			t.Errorf("%s: %#x, msgpcode %#x", c.name, c.ours, c.lib)
		}
	}
	for c := range 256 {
		b := byte(c)
		if isFixedNum(b) != msgpcode.IsFixedNum(b) || isFixedMap(b) != msgpcode.IsFixedMap(b) ||
			isFixedArray(b) != msgpcode.IsFixedArray(b) || isFixedString(b) != msgpcode.IsFixedString(b) ||
			isFixedExt(b) != msgpcode.IsFixedExt(b) || isStr(b) != msgpcode.IsString(b) || isBin(b) != msgpcode.IsBin(b) {
			t.Errorf("code %#x classified differently from msgpcode", b)
		}
	}
}
