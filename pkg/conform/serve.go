package conform

import (
	"context"
	"errors"
)

// Accept waits for the peer's client and plays its tool's server
// (requester scenarios).
func Accept(ctx context.Context, cfg *Config, o ConnOptions) (*Conn, error) {
	return nil, errors.New("requester mode is not built yet")
}
