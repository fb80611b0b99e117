"""Code generation: a Plan -> C++/CUDA sources (one TU per kernel instance, the step program,
the plan header) rendered from Jinja templates fed typed records."""
