package kvevents

// msgpack's type codes as constants: msgpcode declares them as variables, so every
// comparison would load one from memory and no switch on a code could become a jump
// table or range test.
// TestCodesMatchMsgpcode checks them against msgpcode.
const (
	codePosFixedNumHigh byte = 0x7f
	codeNegFixedNumLow  byte = 0xe0
	codeNil             byte = 0xc0
	codeFalse           byte = 0xc2
	codeTrue            byte = 0xc3
	codeFloat           byte = 0xca
	codeDouble          byte = 0xcb
	codeUint8           byte = 0xcc
	codeUint16          byte = 0xcd
	codeUint32          byte = 0xce
	codeUint64          byte = 0xcf
	codeInt8            byte = 0xd0
	codeInt64           byte = 0xd3
	codeFixedStrLow     byte = 0xa0
	codeFixedStrHigh    byte = 0xbf
	codeFixedStrMask    byte = 0x1f
	codeStr8            byte = 0xd9
	codeStr16           byte = 0xda
	codeStr32           byte = 0xdb
	codeBin8            byte = 0xc4
	codeBin16           byte = 0xc5
	codeBin32           byte = 0xc6
	codeFixedArrayLow   byte = 0x90
	codeFixedArrayHigh  byte = 0x9f
	codeArray16         byte = 0xdc
	codeArray32         byte = 0xdd
	codeFixedMapLow     byte = 0x80
	codeFixedMapHigh    byte = 0x8f
	codeMap16           byte = 0xde
	codeMap32           byte = 0xdf
	codeFixExt1         byte = 0xd4
	codeFixExt16        byte = 0xd8
	codeExt8            byte = 0xc7
	codeExt16           byte = 0xc8
	codeExt32           byte = 0xc9
)

func isFixedNum(c byte) bool    { return c <= codePosFixedNumHigh || c >= codeNegFixedNumLow }
func isFixedMap(c byte) bool    { return c >= codeFixedMapLow && c <= codeFixedMapHigh }
func isFixedArray(c byte) bool  { return c >= codeFixedArrayLow && c <= codeFixedArrayHigh }
func isFixedString(c byte) bool { return c >= codeFixedStrLow && c <= codeFixedStrHigh }
func isFixedExt(c byte) bool    { return c >= codeFixExt1 && c <= codeFixExt16 }
