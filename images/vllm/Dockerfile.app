# The app on top of intellect-runtime-vllm (images/vllm/Dockerfile says why in two steps): the code and
# console scripts of the workload image WORKLOAD, whose id the image keeps as a label.
ARG RUNTIME_VLLM
ARG WORKLOAD=intellect-workload:latest
FROM ${WORKLOAD} AS app
FROM ${RUNTIME_VLLM}
ARG WORKLOAD_ID
COPY --from=app /opt/intellect/ /opt/intellect/
COPY --from=app /usr/local/bin/ /usr/local/bin/
LABEL org.intellect.image=workload-vllm org.intellect.workload=${WORKLOAD_ID}
WORKDIR /data
ENV HOME=/data
CMD ["python3", "-m", "workloads.inference"]
