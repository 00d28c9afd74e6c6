"""The pieces of ``scripts/gpu-calibrate`` (its entry point is ``scripts/gpu_calibrate.py``): the models
under test, the parsing of llama-server's logs and nvidia-smi's output, the comparison with the plan, the
GPU machine, the run through the router, and the printed report."""
