"""What a scheme costs: memory estimates (memory), timing of bias construction and attention
(profiling), and what a trained model's attention looks like (inspection)."""
