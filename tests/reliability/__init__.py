"""Issue 8: the crash matrix, API faults and hostile input (``make reliability``)."""
