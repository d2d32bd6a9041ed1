"""``Executor``: run a compiled program on a device, dispatch by dispatch, over one preallocated arena.

Construction does everything that can be done once: the arena is allocated, every tensor is given its
view of the arena (or of its base, for a view), every dispatch gets its kernel. Binding a weight set
prepares the kernels (batch norm folded, weights prepacked) and builds, per dispatch, the lists of
input and output tensors, so that a run is the input copy, a loop of ``kernel.run(inputs, outputs)``
and the output copies: nothing is looked up or allocated per dispatch.

Host dispatches (``Dispatch.host``, from ``compile(fallback="cpu")``) run in the same loop: the backend gives
them a kernel that runs the op's reference implementation on the host CPU, after the op was checked to be
one the registry has and may run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from npu_program.check import check_program
from npu_program.dynamic import DynamicProgram
from npu_program.kernels import kernels_for
from npu_program.memory_check import alias_roots
from npu_program.program import CompiledProgram, TensorSpec
from torch_ir.errors import TorchIRError

from .device import Device, NPUBuffer, RuntimeInputError, as_device, check_array, host_array
from .dynamic import DynamicExecutor
from .embedding_ids import check_ids, ids_checks
from .reference import check_host_dispatches, check_output_shapes
from .state import State, check_slot
from .threads import RunThreads
from .validate import DispatchValidator
from .weights import Weights, already_loaded, load_weights, weights_required

Step = tuple[Callable[[list[Any], list[Any]], None], list[Any], list[Any]]
StepHook = Callable[[int, Step], None]
InputValue = NPUBuffer | np.ndarray | Any


class DispatchError(TorchIRError, RuntimeError):
    """A kernel failed; the message names the dispatch, its kernel and the IR node it came from."""


class Executor:
    """Runs one ``CompiledProgram`` on one device.

        executor = Executor(program, device)
        weights = load_weights("model.safetensors", program, device)
        outputs = executor.run(inputs={"input": buffer}, weights=weights)   # name -> NPUBuffer
    """

    def __new__(cls, program: CompiledProgram | DynamicProgram, *args: Any, **kwargs: Any) -> Any:
        """A ``DynamicProgram`` (shape buckets) gets a ``DynamicExecutor``, which takes inputs of any shape it
        serves; a ``CompiledProgram`` an ``Executor``."""
        if cls is Executor and isinstance(program, DynamicProgram):
            return DynamicExecutor(program, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, program: CompiledProgram, device: Device | Any = None, *, validate: bool = False,
                 arena: Any = None) -> None:
        """``arena``: device memory of at least ``program.arena_bytes`` to place the activations in, shared with
        other programs (the variants of a dynamic program; the bind-time results then get memory of their own);
        None allocates it.

        ``validate=True`` checks every dispatch's outputs against the reference implementation of the op it
        came from, run on the same inputs, and stops at the first that diverges (``ValidationError``
        names the dispatch, its IR node and the error), as tinygrad's ``VALIDATE_WITH_CPU`` does."""
        self.program = program
        self.validate = validate
        self._validation_hook: StepHook | None = None
        self.device = as_device(device if device is not None else "cpu")
        backend = self.device.backend
        if backend.target != program.target:
            raise RuntimeInputError(
                f"program {program.model_name!r} was compiled for target {program.target!r}; the {backend.name} "
                f"backend runs target {backend.target!r}: compile with npu_compiler.compile(..., "
                f"target={backend.target!r}), or run it on a backend of its target (Device({program.target!r}), "
                f"torch-ir run --backend {program.target})")
        # a loaded program is untrusted data: re-check it (against this backend's kernels) before allocating
        kernels = getattr(backend, "kernels", None)
        check_program(program, kernels=kernels if kernels is not None else kernels_for(backend.target))
        # host dispatches name ops, not kernels: each must be an op the registry has and may run
        check_host_dispatches(program)
        self.arena = backend.allocate(program.arena_bytes) if arena is None else arena
        self.tensors = self._place(shared_arena=arena is not None)
        self.constants = {name: backend.from_bytes(data, program.tensors[name])
                          for name, data in program.constants.items()}
        self.specs: dict[str, TensorSpec] = {**program.tensors, **{w.name: w for w in program.weight_specs},
                                             **{s.name: s.tensor_spec() for s in program.state_specs}}
        # fixed for every run: constants, weights and what the bind-time dispatches compute from them once
        self.fixed = set(self.constants) | {w.name for w in program.weight_specs} | set(program.bind_outputs)
        read = {n for d in program.dispatches for n in d.inputs} | {s.name for s in program.output_specs}
        self._unread = {n for d in program.dispatches for n in d.outputs} - read
        # graph inputs that are an EMBEDDING's ids: range-checked at copy-in, since a shader cannot raise
        self._ids_checks = ids_checks(program, self.specs)
        self.kernels = [self._kernel(i, d) for i, d in enumerate(program.dispatches)]
        self.steps: list[Step] = []
        self.chains: Any = None  # the CPU backend's chains of native dispatches (backends.cpu_chain), made at bind
        self.bound: Weights | Mapping[str, NPUBuffer] | None = None
        # The persistent buffers the steps read and write (outside the arena, like weights); None until bound.
        self.state: State | None = None
        self.runs = 0  # runs so far (a generator's prefill runs are counted by it in tests and reports)
        # the CPU backend's choice of thread count per run (npu_runtime.threads); None elsewhere
        run_threads = getattr(backend, "run_threads", None)
        self.threads: RunThreads | None = run_threads() if run_threads is not None else None

    def _kernel(self, index: int, dispatch: Any) -> Any:
        check_output_shapes(index, dispatch, self.specs, self.program.model_name,  # before any prepacking
                            self._unread)
        try:
            return self.device.backend.kernel(dispatch, self.specs, self.fixed)
        except TorchIRError:
            raise
        except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as e:
            raise RuntimeInputError(
                f"dispatch {index} ({dispatch.kernel}, node {dispatch.node!r}) of program {self.program.model_name!r} "
                f"has parameters its kernel cannot use ({type(e).__name__}: {e}); recompile the model") from None

    def _place(self, shared_arena: bool = False) -> dict[str, Any]:
        """Every activation (and view) at its offset in the arena. In an arena shared with other programs (the
        variants of a dynamic program), what the bind-time dispatches compute gets memory of its own: it must
        survive the other programs' runs, and its arena bytes are then left unused."""
        memory, backend = self.program.memory, self.device.backend
        placed = {}
        roots = alias_roots(memory.aliases)  # once: resolving each view on its own is quadratic in a chain
        kept = {roots.get(n, n) for n in self.program.bind_outputs} & set(memory.offsets) if shared_arena else set()
        own = {root: backend.allocate(self.program.tensors[root].nbytes) for root in sorted(kept)}
        for name, spec in self.program.tensors.items():
            root = roots.get(name, name)
            if root in own:
                placed[name] = backend.view(own[root], 0, spec)
            elif root in memory.offsets:
                placed[name] = backend.view(self.arena, memory.offsets[root], spec)
        return placed

    # -- weights ------------------------------------------------------------------------------------

    def bind(self, weights: Weights | Mapping[str, NPUBuffer] | Any, state: State | None = None) -> None:
        """Prepare every kernel for ``weights`` (a ``load_weights`` result, or anything it accepts) and
        ``state`` (a ``State``; None: the one bound before, or a new one made from the program's slots)."""
        if not already_loaded(weights):
            weights = load_weights(weights, self.program, self.device)
        missing = sorted({w.name for w in self.program.weight_specs} - set(weights))
        if missing:
            raise RuntimeInputError(f"weights for program {self.program.model_name!r} lack slots {missing[:10]}; "
                                    "load them with npu_runtime.load_weights(path, program, device)")
        state = self._state(state)
        env = {**self.tensors, **self.constants, **{w.name: weights[w.name].data for w in self.program.weight_specs},
               **{spec.name: state[spec.key].data for spec in self.program.state_specs}}
        self.steps = []
        for index, (dispatch, kernel) in enumerate(zip(self.program.dispatches, self.kernels)):
            try:
                kernel.prepare({name: env[name] for name in dispatch.inputs if name in self.fixed})
            except (RuntimeError, ValueError, TypeError, IndexError) as e:  # prepacking refused the parameters
                raise RuntimeInputError(
                    f"dispatch {index} ({dispatch.kernel}, node {dispatch.node!r}) of program "
                    f"{self.program.model_name!r} cannot be prepared with its weights ({type(e).__name__}: "
                    f"{str(e).splitlines()[0] if str(e) else ''}); recompile the model") from None
            step = (kernel.run, [env[n] for n in dispatch.inputs], [env[n] for n in dispatch.outputs])
            if dispatch.at_bind:  # computed now, from the weights, before a later kernel prepacks its result
                self._run_at_bind(index, step)
                step = (_already_computed, *step[1:])
            self.steps.append(step)
        chains = getattr(self.device.backend, "chains", None)
        self.chains = chains(self.kernels, self.steps, [not d.at_bind for d in self.program.dispatches]) \
            if chains is not None else None
        self.bound, self.state = weights, state

    def _run_at_bind(self, index: int, step: Step) -> None:
        backend = self.device.backend
        backend.begin_run()
        try:
            step[0](step[1], step[2])
        except TorchIRError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the dispatch that failed
            raise self._failed(index, e, " at bind time") from e
        finally:
            backend.end_run()

    def _failed(self, index: int, error: Exception, when: str = "") -> DispatchError:
        dispatch = self.program.dispatches[index]
        return DispatchError(f"dispatch {index} ({dispatch.kernel}, node {dispatch.node!r}) of program "
                             f"{self.program.model_name!r} failed{when}: {type(error).__name__}: {error}")

    def _state(self, state: State | None) -> State:
        """``state`` checked against the program's slots (slots it lacks are added to it)."""
        if state is None:
            return self.state if self.state is not None else State(self.program, self.device)
        if not isinstance(state, State):
            raise RuntimeInputError(f"state must be an npu_runtime.State, got {type(state).__name__}; make one "
                                    "with State(program, device)")
        if state.device.backend.target != self.device.backend.target:
            raise RuntimeInputError(f"the State lives on {state.device.name}; program {self.program.model_name!r} "
                                    f"runs on {self.device.name}")
        for spec in self.program.state_specs:
            if spec.key in state:
                check_slot(state.specs[spec.key], spec, "the State given")
        state.add(self.program)
        return state

    # -- running ------------------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, InputValue],
            weights: Weights | Mapping[str, NPUBuffer] | None = None,
            state: State | None = None) -> dict[str, NPUBuffer]:
        """Run once; returns the outputs by name as new buffers (the next run does not overwrite them).

        ``state`` (a ``State``) holds the program's persistent buffers; the dispatches update it in place.
        Without one, the State bound before is used (the first run makes one, ``executor.state``)."""
        self.ensure_bound(weights, state)
        self.copy_in(inputs)
        self.runs += 1
        if self.validate:
            self.run_steps(self._validator())
        elif self.threads is None:
            self.run_steps()
        else:
            with self.threads.run():
                self.run_steps()
        return self.copy_out()

    def _validator(self) -> StepHook:
        """The validation hook, made once (it binds every dispatch's reference)."""
        if self._validation_hook is None:
            self._validation_hook = DispatchValidator(self)
        return self._validation_hook

    def ensure_bound(self, weights: Any, state: State | None = None) -> None:
        """Bind ``weights`` and ``state`` if they are new; without them, the ones bound before (a program
        without weight slots needs no weights)."""
        new_state = state is not None and state is not self.state
        if weights is not None and weights is not self.bound:
            self.bind(weights, state)
        elif self.bound is not None and new_state:
            self.bind(self.bound, state)
        elif self.bound is None:
            if self.program.weight_specs:
                raise weights_required(self.program)
            self.bind({}, state)

    def copy_in(self, inputs: Mapping[str, InputValue]) -> None:
        """Check every input against its spec and copy it into its arena slot."""
        specs = self.program.input_specs
        names = [s.name for s in specs]
        missing, extra = [n for n in names if n not in inputs], [n for n in inputs if n not in names]
        if missing or extra:
            raise RuntimeInputError(f"program {self.program.model_name!r} takes inputs {names}; "
                                    f"missing {missing}, unexpected {extra}")
        backend = self.device.backend
        for spec in specs:
            value = inputs[spec.name]
            where = f"input {spec.name!r} of program {self.program.model_name!r}"
            if isinstance(value, NPUBuffer):
                if list(value.spec.shape) != list(spec.shape) or value.spec.dtype != spec.dtype:
                    raise RuntimeInputError(f"{where} must be {spec.dtype}{list(spec.shape)}, got the buffer "
                                            f"{value!r}")
                if spec.name in self._ids_checks:  # ids already on the device: read back (a few integers)
                    check_ids(value.to_numpy(), spec.name, self._ids_checks[spec.name], self.program.model_name)
                backend.copy(self.tensors[spec.name], value.data)
            else:
                array = host_array(value)
                check_array(array, spec, where)
                if spec.name in self._ids_checks:
                    check_ids(array, spec.name, self._ids_checks[spec.name], self.program.model_name)
                backend.copy_in(self.tensors[spec.name], array)

    def run_steps(self, hook: StepHook | None = None) -> None:
        """The dispatch loop itself, between the backend's run boundary (a GPU backend records every
        dispatch and submits once at ``end_run``).

        ``hook(index, step)`` replaces the plain ``run(ins, outs)`` call of each step (it must call the
        step itself, or not): profiling times each dispatch with it, ``validate`` checks each one.
        """
        backend, index = self.device.backend, 0
        chains = self.chains if hook is None else None  # a hook sees every dispatch: no chains then
        backend.begin_run()
        try:
            if chains is not None:
                chains.run()
            elif hook is None:
                for index, (run, ins, outs) in enumerate(self.steps):  # noqa: B007 - the except reads index
                    run(ins, outs)
            else:
                for index, step in enumerate(self.steps):
                    hook(index, step)
        except TorchIRError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the dispatch that failed
            raise self._failed(chains.at if chains is not None else index, e) from e
        finally:
            backend.end_run()

    def copy_out(self) -> dict[str, NPUBuffer]:
        backend = self.device.backend
        return {spec.name: NPUBuffer(backend.clone(self.tensors[spec.name]), spec, self.device)
                for spec in self.program.output_specs}

    def profile(self, inputs: Mapping[str, InputValue], weights: Any = None, *, runs: int = 10,
                warmup: int | None = None, threads: int | None = None) -> Any:
        """Time every dispatch over ``runs`` runs after a warm-up (None: until the times settle), at ``threads``
        threads (None: torch's count); see ``npu_runtime.profile.Profile``."""
        from .profile import profile_executor

        return profile_executor(self, inputs, weights, runs=runs, warmup=warmup, threads=threads)


def _already_computed(inputs: Any, outputs: Any) -> None:
    """The run of a bind-time dispatch: its outputs were computed when the weights were bound."""
