"""What a scheme costs: memory estimates (memory: a step's tensors and the budget; resident: a
training process's peak), timing of bias construction and attention (profiling), and what a trained
model's attention looks like (inspection)."""
