#ifdef __cplusplus
}
#endif

#endif /* ${PREFIX}_MODEL_H */
