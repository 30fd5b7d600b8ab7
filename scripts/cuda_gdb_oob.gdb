# cuda-gdb's commands for the off-by-one kernel of csrc/part3/planted_bugs.cu (scripts/capture_cuda_gdb.sh)
set pagination off
set breakpoint pending on
break iota<true>
run
info cuda kernels
cuda block (3,0,0) thread (232,0,0)
next
next
print i
print n
print inside
info cuda blocks
cuda block (3,0,0) thread (231,0,0)
print i
print inside
delete
continue
