"""npu_compiler: compile the IR into a program of kernel dispatches (.npubin)."""
