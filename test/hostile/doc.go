// Package hostile holds the tests of a whole device against a hostile host
// on the fabric: one that sends any packet it likes with a valid ICRC
// (the ICRC is a CRC anyone can compute: docs/security.md), from its own
// address or a forged one. FuzzEngineReceive drives a device on the
// in-memory network with fuzzer-chosen packets and checks, after each,
// that nothing panicked or hung, that what the device sent in answer is
// bounded, that memory the packets had no key for is untouched and that
// the device still serves its real peer. The named tests beside it each
// pin one attack read off the code with that threat model.
package hostile
