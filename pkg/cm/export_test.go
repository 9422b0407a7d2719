package cm

// Sizes of the Manager's tables, for the tests' memory bounds.
func (m *Manager) TableSizes() (ids, remoteIDs, remoteQPs, sidr, outbox int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.ids), len(m.remoteIDs), len(m.remoteQPs), len(m.sidrRcvd), len(m.outbox)
}

// SIDRAnswers is how many SIDR_REPs the Manager keeps for duplicates.
func (m *Manager) SIDRAnswers() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.sidrSent)
}
