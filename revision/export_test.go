package revision

// Queued is how many requests wait in the queue, not yet taken by a batch.
func (s *Sequencer[Resp]) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}
