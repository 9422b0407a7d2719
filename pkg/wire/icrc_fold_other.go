//go:build !amd64 || purego

package wire

// canFold is false where there is no vector CRC of our own: ICRC then hands
// the payload to hash/crc32 after the headers' register.
const canFold = false

func foldAVX512(uint32, *[8]uint64, []byte) uint32 { panic("wire: foldAVX512 without AVX-512") }
