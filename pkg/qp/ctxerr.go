package qp

import (
	"context"
	"fmt"
)

// ContextError is the error a wait that ctx ended returns: ctx.Err(),
// and the cause its canceller gave (context.WithCancelCause,
// WithTimeoutCause) when there is one, so that errors.Is finds both
// context.Canceled (or DeadlineExceeded) and the reason. A bare
// ctx.Err() lost the reason: an application that cancels a wait from
// several places could not tell which one ended it.
func ContextError(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
