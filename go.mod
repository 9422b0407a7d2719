module github.com/rxed/rxed

go 1.26.8

require (
	github.com/gopacket/gopacket v1.7.7
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.62.0
	golang.org/x/sys v0.50.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
