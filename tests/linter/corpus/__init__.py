"""Real in-place/autograd bugs and legal patterns from public threads; see each file's Source."""
