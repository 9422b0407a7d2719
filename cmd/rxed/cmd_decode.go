package main

import "github.com/rxed/rxed/internal/decode"

func init() {
	register(&command{
		name:    "decode",
		summary: "print the RoCEv2 packets of a pcap/pcapng file (-v every field, -json, --port N for engines off 4791)",
		run:     decode.Run,
	})
}
