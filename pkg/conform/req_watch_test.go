package conform

import (
	"testing"
	"time"
)

// schedule turns intervals (ms) into arrival times from 0.
func schedule(gaps ...float64) []time.Duration {
	at := []time.Duration{0}
	for _, g := range gaps {
		at = append(at, at[len(at)-1]+time.Duration(g*float64(time.Millisecond)))
	}
	return at
}

// TestRetransmissionSchedule: the timer judgment accepts what a conformant
// requester's retransmissions look like when either end is descheduled
// (intervals measured by rxed conform against rxed's client, timeout 15 =
// 134 ms, under -race with six test processes on two cores), and fails
// timers that are really too short or too long.
func TestRetransmissionSchedule(t *testing.T) {
	const T = 134217728 * time.Nanosecond
	cases := []struct {
		name        string
		at          []time.Duration
		early, late bool
	}{
		{"on time, 7", schedule(135.5, 134.4, 134.3, 134.4, 135, 134.4, 134.6), false, false},
		{"late delivery then on schedule", schedule(137.7, 134.6, 134.9, 152.2, 147.8, 599, 130.1), false, false},
		{"compensating pair 185+87", schedule(132.5, 134.3, 135.5, 134.9, 185.4, 86.7, 135.2), false, false},
		{"compensating pair 274+4", schedule(162.8, 274.1, 3.7, 126.1, 135, 135.4, 135.2), false, false},
		{"late first arrival", schedule(110.6, 134.8, 347.1, 129.8, 134.9, 142.2, 127.6), false, false},
		{"3 with a stall", schedule(1689.7, 76.5, 45.8), false, false},
		{"3, short last", schedule(291, 130.9, 1.3), false, false},
		{"3 rounded up 2x", schedule(268, 268, 268), false, false},
		{"one retransmission at once", schedule(1), false, false}, // one interval says nothing about a schedule
		{"timer T/2, 3", schedule(67, 67, 67), true, false},
		{"timer 3/4 T, 7", schedule(100, 100, 100, 100, 100, 100, 100), true, false},
		{"no timer, 7", schedule(1, 1, 1, 1, 1, 1, 1), true, false},
		{"timer 8T, 3", schedule(1074, 1074, 1074), false, true},
		{"timer 8T with one on time", schedule(134, 1074, 1074), false, true},
	}
	for _, tc := range cases {
		if got := timerEarly(tc.at, T); got != tc.early {
			t.Errorf("%s: timerEarly = %v, want %v", tc.name, got, tc.early)
		}
		if got := timerLate(tc.at, T); got != tc.late {
			t.Errorf("%s: timerLate = %v, want %v", tc.name, got, tc.late)
		}
	}
}
