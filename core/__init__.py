"""The domain facts every other part of whatif shares, each defined once: errors, data types
(element sizes and compute dtypes), and what a GPU kernel is (its class: GEMM, attention,
collective…). A leaf: it imports nothing else of whatif."""
