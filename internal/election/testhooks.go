package election

// The hooks below are for the relay's tests only.

// MissForTest makes the check find that the pool keeps its sessions without
// looking, as a check that missed a pooler would.
func (c *SessionCheck) MissForTest() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.miss = true
}
