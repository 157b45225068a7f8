"""`hare bench peers [MODEL_DIR]`: hare's bundle against the best CPU stacks for embeddings, side by side, in
this process, on the same texts and the same machine (issue 35).

Candidates (a candidate whose packages are missing, or fail to import or export, is skipped and the table
says why; with the dev dependencies only, hare and sentence-transformers' torch run):

    hare            hare's bundle with hare's own code: its tokenizer.json, container/runtime.py's OnnxModel
                    (hare's session options), tasks/ops.py's pad_batch, pooling and normalizing, scheduled as
                    a server worker on that many cores runs it: one text on every core; a batch in calls of
                    the bundle's batch budget on one-thread sessions, one per core at once
    hare-http       `hare serve` of the bundle on that many of this process's CPUs, one POST /predict per call
                    (base64 vectors): end to end, the client's own work included in its cores
    torch           sentence-transformers on PyTorch, fp32: the reference every cosine is taken against
    onnx            sentence-transformers backend="onnx" (Optimum's export), fp32
    onnx-int8       the same after export_dynamic_quantized_onnx_model (dynamic, per-channel int8 weights) with
                    the configuration this CPU calls for (avx512_vnni, avx512, avx2 or arm64)
    openvino        sentence-transformers backend="openvino" (Optimum Intel's export), fp32
    openvino-int8   the same after static int8 quantization, as export_static_quantized_openvino_model does it
                    (OVQuantizationConfig's defaults, inputs padded to 384 tokens) but calibrated on our own
                    texts: that function only calibrates on a dataset from the Hugging Face Hub
    fastembed       fastembed's TextEmbedding, fp32, on Optimum's ONNX export (what fastembed downloads for
                    this model is such an export; offline it is pointed at ours with specific_model_path)

Threads, for each: torch.set_num_threads (torch); SessionOptions.intra_op_num_threads (hare's lone text,
onnx, onnx-int8; each library's other session options as it sets them); INFERENCE_NUM_THREADS in ov_config
(openvino, openvino-int8; Optimum Intel's PERFORMANCE_HINT LATENCY kept); TextEmbedding(threads=) (fastembed);
the server's CPUs (hare-http). Every ONNX Runtime and OpenVINO candidate loads one model per thread count.

Speed: texts of exactly `seq_len` tokens (special tokens included, bench/inputs.py), encoded in calls of
1 and of `batch` texts, each library's own encode call timed (tokenizing, inference, pooling, normalizing).
Figures: the p50 of a call at batch 1 (ms), and sentences a second at `batch` (texts over the summed call
times). Candidates are alternated in rounds (every slot, all candidates, then the next slot; the first
candidate rotates each round), each slot with its own warm-up calls, so that a drift in the machine's load
hits them all alike. The process's CPU time is kept per call (every thread's: on a busy machine the steadier
comparison) and over each slot's wall time (cores: a library that uses more threads than asked shows it).

Fidelity: `fidelity` texts of 3 to `fidelity_max` tokens, cut at exact token counts from prose in Python's
own documentation (pydoc_data, in the standard library: text that neither hare's validation set nor the
OpenVINO calibration set holds); each candidate's vectors against torch's: the 1st percentile and the mean
of the cosines.

Results go to the bench store (bench/store.py) as one run of kind "peers": a point per candidate, thread
count and batch (target = the candidate's key, load "in-process", client_cpu = cores used), the table and
the goal in the run's summary. Exports are kept under the bench cache (`--work`), one folder per model.

Modules, in the order a run uses them:

    options.py      the candidates' names and labels, and PeersOptions
    texts.py        the speed texts (exact token counts) and the fidelity texts (prose from pydoc_data)
    candidates/     one module per runtime (hare, sentence_transformers, openvino, fastembed), each loading its
                    candidates at a thread count; base.py says what each needs and skips what cannot run;
                    workspace.py keeps the exports from run to run
    timing.py       one slot: warm-up calls, then calls timed with the process's CPU time
    results.py      a candidate's row of figures, its fidelity, and the goal
    runner.py       run_peers: load, check fidelity, time in rounds, store the run
    tables.py       the tables `hare bench peers` and `hare bench show` print (and the results page renders)

Nothing is imported here, so that the tables load without onnxruntime or the peers' packages.
"""
